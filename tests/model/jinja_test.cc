// model/jinja's semantics, construct by construct: each expected text is what Python's jinja2
// 3.1.6 renders with transformers' settings (trim_blocks, lstrip_blocks, loopcontrols, its
// tojson); then the errors and the bounds that keep any template from crashing or running away.
#include <string>

#include "gtest/gtest.h"
#include "model/jinja/template.h"

namespace fpa::jinja {
namespace {

using nlohmann::ordered_json;

absl::StatusOr<std::string> render(const std::string& source, const ordered_json& context = {},
                                   const RenderOptions& options = {}) {
  absl::StatusOr<Template> t = Template::parse(source);
  if (!t.ok()) return t.status();
  return t->render(context.is_null() ? ordered_json::object() : context, options);
}

struct Case {
  const char* source;
  const char* context;
  const char* expected;
};

// Whitespace control, scoping, loops, macros, call blocks, block sets, slices, arithmetic,
// Python printing, tojson, str methods, filters, tests and conditional expressions.
const Case kCases[] = {
    {"{% for x in [1, 2] %}\n  {{ x }}\n{% endfor %}\n", "{}", "  1\n  2\n"},
    {"a  {%- if true -%}  b  {%- endif %}  c", "{}", "ab  c"},
    {"  {%+ if true %}x{% endif %}", "{}", "  x"},
    {"{# c #}\n  {% if true %}\ny{% endif %}", "{}", "y"},
    {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", "{}", "1"},
    {"{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ "
     "ns.x }}",
     "{}", "4"},
    {"{% for a, b in {'k': 1, 'j': [2]}.items() %}{{ loop.index }}{{ a }}={{ b }}{% if not "
     "loop.last %},{% endif %}{% endfor %}",
     "{}", "1k=1,2j=[2]"},
    {"{% for x in [1, 2, 3] if x != 2 %}{{ loop.length }}{{ loop.previtem is defined }}{% else "
     "%}none{% endfor %}",
     "{}", "2False2True"},
    {"{% for x in [] %}x{% else %}empty{% endfor %}{% for x in range(10) %}{% if x == 3 %}{% break "
     "%}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}",
     "{}", "empty02"},
    {"{% macro m(a, b='d', c=a ~ '!') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, c=3) "
     "}}|{{ m('x', 'y') }}",
     "{}", "1d1!|1d3|xyx!"},
    {"{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}", "{}", "[in]"},
    {"{% set t %}A{{ 1 + 1 }}{% endset %}{{ t }}{{ t|length }}", "{}", "A22"},
    {"{{ 'héllo'[1:] }}{{ 'abc'[::-1] }}{{ [1, 2, 3][-2:] }}{{ 'héllo'|length }}{{ 'x'[5] is "
     "defined }}",
     "{}", "éllocba[2, 3]5False"},
    {"{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 1 / 4 }} {{ 3 * 1.0 }} {{ 1e20 }} "
     "{{ 0.00001 }} {{ 10 / 5 }}",
     "{}", "3 -4 -2 1024 0.25 3.0 1e+20 1e-05 2.0"},
    {"{{ none }} {{ true }} {{ [1, 'a', none, 1.5, {'k': false}] }} {{ \"it's\" }} {{ [\"it's\"] "
     "}} {{ {'a': \"x'y\\\"\"} }}",
     "{}", "None True [1, 'a', None, 1.5, {'k': False}] it's [\"it's\"] {'a': 'x\\'y\"'}"},
    {"{{ {'b': 1, 'a': [1, 2]}|tojson }}|{{ {'b': 1, 'a': [1, {}]}|tojson(indent=2) }}|{{ "
     "'é\"\\n'|tojson }}|{{ [1.0, none, true]|tojson }}",
     "{}",
     "{\"b\": 1, \"a\": [1, 2]}|{\n  \"b\": 1,\n  \"a\": [\n    1,\n    {}\n  "
     "]\n}|\"é\\\"\\n\"|[1.0, null, true]"},
    {"{{ '  x y  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b "
     "'.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'abc'.startswith(('x', 'a')) }}|{{ 'hello "
     "world'.title() }}|{{ 'a-b'|title }}",
     "{}", "x y|a|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|True|Hello World|A-B"},
    {"{{ x|default('d') }}{{ ''|default('e', true) }}{{ [3, 1]|first }}{{ 'ab'|last }}{{ [1, "
     "2]|join('-') }}{{ 'AbC'|lower }}{{ 'ab'|upper }}{{ '3'|int + 1 }}{{ 2|string ~ 'x' }}",
     "{}", "de3b1-2abcAB42x"},
    {"{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='c')|list }}{{ "
     "msgs|rejectattr('role', 'eq', 'user')|list|length }}{{ [1, 2, 3, 4]|select('odd')|list }}{{ "
     "['a', 'A', 'b']|unique|list }}",
     "{\"msgs\": [{\"role\": \"user\", \"c\": 1}, {\"role\": \"bot\", \"c\": 2}, {\"role\": "
     "\"user\", \"c\": 3}]}",
     "[1, 3]1[1, 3]['a', 'b']"},
    {"{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ x is none }}{{ y is none "
     "}}{{ 1 is number }}{{ 'a' is string }}{{ {} is mapping }}{{ 4 is divisibleby 2 }}{{ 'a' in "
     "'cat' }}{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}",
     "{\"y\": null}", "a\n  b\n\n  c|  a\n  b|FalseTrueTrueTrueTrueTrueTrueTrueTrue"},
    {"{{ 'yes' if 1 > 2 }}|{{ 'a' if false else 'b' }}|{{ 0 or 'x' }}|{{ 1 and 'y' }}|{{ not none "
     "}}|{{ (x.y is defined) if x is defined else 'u' }}|{{ d.get('k', 'z') }}{{ d.keys()|list }}",
     "{\"d\": {\"q\": 1}}", "|b|x|y|True|u|z['q']"},
    {"{% macro a(x, y) %}A{{ x }}{{ y }}{% endmacro %}{% set fs = [a] + [a] %}{% for i in "
     "range(2) %}{{ fs[i](*[i, 9]) }}{% endfor %}",
     "{}", "A09A19"},
};

TEST(Jinja, RendersAsPythonsJinja) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.source);
    absl::StatusOr<std::string> out = render(c.source, ordered_json::parse(c.context));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, c.expected);
  }
}

void expect_error(const std::string& source, const std::string& message,
                  const RenderOptions& options = {}) {
  absl::StatusOr<std::string> out = render(source, ordered_json::object(), options);
  ASSERT_FALSE(out.ok()) << source;
  EXPECT_NE(std::string(out.status().message()).find(message), std::string::npos)
      << source << " -> " << out.status();
}

TEST(Jinja, UnsupportedConstructsAreNamed) {
  expect_error("{% include 'x' %}", "unsupported: {% include %}");
  expect_error("{{ x|wordwrap }}", "unsupported: filter 'wordwrap'");
  expect_error("{{ x is sameas_nothing }}", "unsupported: test 'sameas_nothing'");
  expect_error("{{ f(**kwargs) }}", "unsupported: **kwargs");
  expect_error("{% for x in y recursive %}{% endfor %}", "unsupported: recursive loops");
  expect_error("{% set x = [] %}{{ x.append(1) }}", "unsupported: append()");
  expect_error("{{ 1 < 2 < 3 }}", "unsupported: chained comparison");
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  expect_error("a\n{% for x in y %}", "missing 'endfor'");
  expect_error("a\n\n{{ 1 + }}", "line 3: unexpected '}}'");
  expect_error("{% break %}", "'break' outside a loop");
  expect_error("{{ 'abc }}", "unterminated string");
  expect_error("{# open", "unterminated comment");
}

TEST(Jinja, RaiseExceptionCarriesItsMessage) {
  absl::StatusOr<std::string> out = render("{{ raise_exception('roles must alternate') }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "roles must alternate");
}

TEST(Jinja, UndefinedBehavesAsJinjasDefault) {
  EXPECT_EQ(*render("[{{ nope }}]{{ nope|length }}{{ nope is defined }}{% for x in nope %}x"
                    "{% endfor %}"),
            "[]0False");
  expect_error("{{ nope.attr }}", "'nope' is undefined");
  expect_error("{{ nope + 1 }}", "'nope' is undefined");
}

TEST(Jinja, StrftimeNowReadsTheInjectedClock) {
  RenderOptions options;
  options.now = [] { return std::chrono::system_clock::from_time_t(1752148800); };
  setenv("TZ", "UTC", 1);
  tzset();
  EXPECT_EQ(*render("{{ strftime_now('%Y-%m-%d %b') }}", {}, options), "2025-07-10 Jul");
}

TEST(Jinja, BoundsStopRunawayTemplates) {
  RenderOptions small;
  small.limits.max_steps = 10'000;
  small.limits.max_output_bytes = 1000;
  expect_error("{% for i in range(100000) %}{% endfor %}", "steps", small);
  expect_error("{% for i in range(2000) %}x{% endfor %}", "output grows past", small);
  expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nest deeper");
  std::string deep_recursion = "{% macro f(n) %}{% if n > 0 %}";
  for (int i = 0; i < 40; ++i) deep_recursion += "{% if true %}";
  deep_recursion += "{{ f(n - 1) }}";
  for (int i = 0; i < 40; ++i) deep_recursion += "{% endif %}";
  expect_error(deep_recursion + "{% endif %}{% endmacro %}{{ f(60) }}", "nest deeper than 1500");
  expect_error("{{ 'x' * 1000000000 }}", "size limit");
  expect_error("{{ range(100000000)|length }}", "too many items");
  expect_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}",
               "nests too deeply");
  expect_error(
      "{% set ns = namespace(x=[]) %}{% for i in range(500) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}",
      "nests too deeply");
  expect_error("{{ 9223372036854775807 + 1 }}", "beyond 64 bits");
  expect_error("{{ x.99999999999999999999 }}", "out of 64-bit range");  // found by the fuzzer
  expect_error("{{ 9223372036854775808 }}", "out of 64-bit range");
}

}  // namespace
}  // namespace fpa::jinja
