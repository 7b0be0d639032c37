// Type-checks Kubernetes objects against the API types of @kubernetes/client-node (generated
// from Kubernetes' OpenAPI spec), with TypeScript's object-literal checks: a misspelt field,
// a string where a number belongs, or a missing required field fails.
// stdin: a JSON array of objects (kubectl kustomize output, converted); exit 0 when all pass.
import { readFileSync } from 'node:fs';
import { jsonType, typeCheck } from './tscheck.mjs';

// apiVersion/kind -> client-node model class.
const models = {
  'apps/v1/Deployment': 'V1Deployment',
  'v1/Service': 'V1Service',
  'v1/ConfigMap': 'V1ConfigMap',
  'autoscaling/v2/HorizontalPodAutoscaler': 'V2HorizontalPodAutoscaler',
  'policy/v1/PodDisruptionBudget': 'V1PodDisruptionBudget',
  'v1/ServiceAccount': 'V1ServiceAccount',
  'rbac.authorization.k8s.io/v1/Role': 'V1Role',
  'rbac.authorization.k8s.io/v1/RoleBinding': 'V1RoleBinding',
};

const objects = JSON.parse(readFileSync(0, 'utf8'));
const decls = objects.map((o, i) => {
  const model = models[`${o.apiVersion}/${o.kind}`];
  if (!model) throw new Error(`no API type for ${o.apiVersion} ${o.kind} (${o.metadata?.name})`);
  return `export const o${i}: Json<${model}> = ${JSON.stringify(o, null, 2)};`;
});
// Only the models used, not the whole client: a fraction of the compile time.
const imports = Object.values(models).map(
  (m) => `import type { ${m} } from '@kubernetes/client-node/dist/gen/models/${m}.js';`);
const source = [...imports, jsonType, ...decls].join('\n');
const label = objects.map((o) => `${o.kind}/${o.metadata?.name}`).join(', ');
process.exit(typeCheck('k8s', source, label) === 0 ? 0 : 1);
