// Type-checks generated TypeScript source with the compiler's strict object-literal checks and
// prints each diagnostic. The source is written inside node_modules so that its imports
// resolve against this folder's packages (and git ignores it).
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const here = dirname(fileURLToPath(import.meta.url));

// Returns the number of type errors in `source`, after printing them with `label`.
export function typeCheck(name, source, label) {
  const dir = join(here, 'node_modules', '.fpa-check');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${name}.ts`);
  writeFileSync(file, source);
  const program = ts.createProgram([file], {
    strict: true,
    noEmit: true,
    module: ts.ModuleKind.ESNext,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
    target: ts.ScriptTarget.ES2022,
    skipLibCheck: true,
    // No DOM and no @types: the checked files need neither, and they are most of the work.
    lib: ['lib.es2022.d.ts'],
    types: [],
  });
  const diagnostics = ts.getPreEmitDiagnostics(program);
  for (const d of diagnostics) {
    const line = d.file ? d.file.getLineAndCharacterOfPosition(d.start).line + 1 : 0;
    console.error(`${d.file ? d.file.fileName : ''}:${line}: ` + ts.flattenDiagnosticMessageText(d.messageText, '\n'));
  }
  console.log(`${diagnostics.length} type errors in ${label}`);
  return diagnostics.length;
}

// JSON and YAML hold an enum's value, not TypeScript's enum type: compare string enums by value.
export const jsonType = `
type Json<T> = T extends string
  ? \`\${T}\`
  : T extends Array<infer U>
    ? Array<Json<U>>
    : T extends object
      ? { [K in keyof T]: Json<T[K]> }
      : T;
`;
