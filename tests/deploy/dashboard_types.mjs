// Type-checks a Grafana dashboard JSON against Grafana's own types (@grafana/schema): the
// dashboard as a whole, and each panel's options and field config against its plugin's
// panelcfg types, with TypeScript's object-literal checks (excess and misspelt fields fail).
// Usage: node dashboard_types.mjs DASHBOARD.json; exit 0 when it type-checks.
import { readFileSync } from 'node:fs';
import { jsonType, typeCheck } from './tscheck.mjs';

// Panel plugin -> its panelcfg module and whether that declares a custom FieldConfig.
const panelcfg = {
  timeseries: ['timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen', true],
  stat: ['stat/panelcfg/x/StatPanelCfg_types.gen', false],
  heatmap: ['heatmap/panelcfg/x/HeatmapPanelCfg_types.gen', true],
};
// Grafana's Prometheus query model (its datasource plugin's dataquery), the fields we use.
const preamble = `
import type { Dashboard, DataQuery, Panel, RowPanel } from '@grafana/schema';
${Object.entries(panelcfg)
  .map(([t, [p]]) => `import type * as ${t} from '@grafana/schema/dist/esm/raw/composable/${p}';`)
  .join('\n')}
interface PromQuery extends DataQuery {
  expr: string;
  legendFormat?: string;
  range?: boolean;
  instant?: boolean;
  format?: 'time_series' | 'table' | 'heatmap';
  interval?: string;
}
${jsonType}
type Typed<O, F> = Json<Omit<Panel<O, F>, 'options' | 'targets'> & { options: O; targets: PromQuery[] }>;
`;

function panelDecl(panel, i) {
  const literal = JSON.stringify(panel, null, 2);
  if (panel.type === 'row') return `export const p${i}: Json<RowPanel> = ${literal};`;
  if (!(panel.type in panelcfg)) throw new Error(`panel ${panel.id}: no schema for type ${panel.type}`);
  const t = panel.type;
  const custom = panelcfg[t][1] ? `${t}.FieldConfig` : 'Record<string, never>';
  return `export const p${i}: Typed<${t}.Options, ${custom}> = ${literal};`;
}

const dashboard = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const source = [
  preamble,
  `export const dashboard: Json<Dashboard> = ${JSON.stringify(dashboard, null, 2)};`,
  ...(dashboard.panels ?? []).map(panelDecl),
].join('\n');

process.exit(typeCheck('dashboard', source, process.argv[2]) === 0 ? 0 : 1);
