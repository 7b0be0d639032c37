// Parses PromQL expressions with Prometheus's own grammar (@prometheus-io/lezer-promql) and
// reports, per expression, the metric names it selects and any syntax errors.
// stdin: a JSON array of expressions; stdout: a JSON array of {metrics, errors}.
import { readFileSync } from 'node:fs';
import { parser } from '@prometheus-io/lezer-promql';

function text(expr, node) {
  return expr.slice(node.from, node.to);
}

// A selector names its metric either before the braces or as {__name__="..."}.
function selectorNames(expr, selector, errors) {
  const names = [];
  const ident = selector.getChild('Identifier');
  if (ident) names.push(text(expr, ident));
  const matchers = selector.getChild('LabelMatchers');
  for (const m of matchers ? matchers.getChildren('UnquotedLabelMatcher') : []) {
    if (text(expr, m.getChild('LabelName')) !== '__name__') continue;
    const op = text(expr, m.getChild('MatchOp'));
    if (op !== '=') errors.push(`__name__${op} selects metrics by pattern; name them exactly`);
    else names.push(JSON.parse(text(expr, m.getChild('StringLiteral'))));
  }
  if (names.length === 0) errors.push(`selector ${text(expr, selector)} names no metric`);
  return names;
}

function analyse(expr) {
  const metrics = new Set();
  const errors = [];
  parser.parse(expr).iterate({
    enter(ref) {
      if (ref.type.isError) {
        errors.push(`syntax error at ${ref.from}: ...${expr.slice(ref.from, ref.from + 20)}`);
      } else if (ref.name === 'VectorSelector') {
        for (const name of selectorNames(expr, ref.node, errors)) metrics.add(name);
      }
    },
  });
  return { metrics: [...metrics].sort(), errors };
}

const exprs = JSON.parse(readFileSync(0, 'utf8'));
process.stdout.write(JSON.stringify(exprs.map(analyse)));
