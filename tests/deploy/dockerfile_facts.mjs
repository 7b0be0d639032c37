// Lints a Dockerfile with dockerfile-utils (the validator behind VS Code's Docker support:
// instruction syntax, flags, ports, signals, stage names, JSON forms) and prints what the
// tests check next, parsed by dockerfile-ast: each stage's instructions with their arguments.
// Usage: node dockerfile_facts.mjs Dockerfile; stdout: {problems, stages: [{name, from,
// instructions: [{keyword, args, json, text}]}]} (text: the whole instruction, one line).
import { readFileSync } from 'node:fs';
import { DockerfileParser } from 'dockerfile-ast';
import { validate, ValidationSeverity } from 'dockerfile-utils';

const content = readFileSync(process.argv[2], 'utf8');
// Everything the validator can flag counts, warnings included.
const strict = {
  deprecatedMaintainer: ValidationSeverity.ERROR,
  directiveCasing: ValidationSeverity.ERROR,
  emptyContinuationLine: ValidationSeverity.ERROR,
  instructionCasing: ValidationSeverity.ERROR,
  instructionCmdMultiple: ValidationSeverity.ERROR,
  instructionEntrypointMultiple: ValidationSeverity.ERROR,
  instructionHealthcheckMultiple: ValidationSeverity.ERROR,
  instructionJSONInSingleQuotes: ValidationSeverity.ERROR,
  instructionWorkdirRelative: ValidationSeverity.ERROR,
};
const problems = validate(content, strict).map((d) => `line ${d.range.start.line + 1}: ${d.message}`);

const stages = [];
for (const instruction of DockerfileParser.parse(content).getInstructions()) {
  const keyword = instruction.getKeyword();
  if (keyword === 'FROM') {
    stages.push({ name: instruction.getBuildStage(), from: instruction.getImage(), instructions: [] });
    continue;
  }
  if (stages.length === 0) continue;  // ARGs before the first FROM
  const json = typeof instruction.getJSONStrings === 'function'
    ? instruction.getJSONStrings().map((s) => s.getJSONValue()) : null;
  stages.at(-1).instructions.push({
    keyword,
    args: instruction.getArguments().map((a) => a.getValue()),
    json: json && json.length ? json : null,
    text: instruction.toString(),
  });
}
process.stdout.write(JSON.stringify({ problems, stages }, null, 1));
