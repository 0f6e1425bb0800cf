// The type a generated dashboard must satisfy: Grafana's own published `Dashboard` type
// (npm @grafana/schema), made usable for JSON and tightened where upstream is an open map.
// tests/integration/test_dashboards.py inlines each dashboard as a `CheckedDashboard` and runs
// `tsc --strict --noEmit`. Each piece below says why it is there.
import type {
  AnnotationQuery,
  DataQuery,
  Dashboard,
  FieldConfig,
  FieldConfigSource,
  Panel,
} from '@grafana/schema';
import type { Options as BarGaugeOptions } from '@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen';
import type { Options as StatOptions } from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type {
  FieldConfig as TableFieldConfig,
  Options as TableOptions,
} from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen';
import type {
  FieldConfig as HeatmapFieldConfig,
  Options as HeatmapOptions,
} from '@grafana/schema/dist/esm/raw/composable/heatmap/panelcfg/x/HeatmapPanelCfg_types.gen';
import type {
  FieldConfig as TimeSeriesFieldConfig,
  Options as TimeSeriesOptions,
} from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';

// String enums (ThresholdsMode, FieldColorModeId, ...) never accept a string literal in
// TypeScript; `${T}` turns each string type into the union of its values, so JSON can satisfy
// them while a misspelt value still fails. Everything else keeps its upstream type.
export type Literal<T> = T extends string
  ? `${T}`
  : T extends readonly (infer U)[]
    ? Literal<U>[]
    : T extends object
      ? { [K in keyof T]: Literal<T[K]> }
      : T;

// Panel options and custom field config: Grafana fills in defaults for what is left out, but
// every key given must exist and hold a valid value.
export type Loose<T> = T extends string
  ? `${T}`
  : T extends readonly (infer U)[]
    ? Loose<U>[]
    : T extends object
      ? { [K in keyof T]?: Loose<T[K]> }
      : T;

// A Prometheus query (upstream: Record<string, unknown>): typos in its keys fail here, bad
// PromQL fails the live-Prometheus test.
export type PromTarget = Literal<DataQuery> & {
  expr: string;
  legendFormat?: string;
  format?: 'time_series' | 'table' | 'heatmap';
  instant?: boolean;
  range?: boolean;
  editorMode?: 'code' | 'builder';
  interval?: string;
  exemplar?: boolean;
};

type Defaults<Custom> = Omit<Literal<FieldConfig>, 'custom'> & { custom?: Custom };
type FieldConfigOf<Custom> = {
  defaults: Defaults<Custom>;
  overrides: Literal<FieldConfigSource>['overrides'];
};
type PanelBase = Omit<Literal<Panel>, 'type' | 'options' | 'fieldConfig' | 'targets'> & {
  targets?: PromTarget[];
};
type NoCustom = Record<string, never>;

// Upstream `Panel.type` is `string`: only the panel types these dashboards may use.
export type TimeSeriesPanel = PanelBase & {
  type: 'timeseries';
  options?: Loose<TimeSeriesOptions>;
  fieldConfig?: FieldConfigOf<Loose<TimeSeriesFieldConfig>>;
};
export type StatPanel = PanelBase & {
  type: 'stat';
  options?: Loose<StatOptions>;
  fieldConfig?: FieldConfigOf<NoCustom>;
};
export type TablePanel = PanelBase & {
  type: 'table';
  options?: Loose<TableOptions>;
  fieldConfig?: FieldConfigOf<Loose<TableFieldConfig>>;
};
export type BarGaugePanel = PanelBase & {
  type: 'bargauge';
  options?: Loose<BarGaugeOptions>;
  fieldConfig?: FieldConfigOf<NoCustom>;
};
export type HeatmapPanel = PanelBase & {
  type: 'heatmap';
  options?: Loose<HeatmapOptions>;
  fieldConfig?: FieldConfigOf<Loose<HeatmapFieldConfig>>;
};
export type CheckedPanel =
  | TimeSeriesPanel
  | StatPanel
  | TablePanel
  | BarGaugePanel
  | HeatmapPanel;

// The Prometheus data source's annotation: its query in `target` (Grafana >= 9 moves a
// top-level `expr` there), the event formatting keys on the annotation itself.
export type PromAnnotation = Omit<Literal<AnnotationQuery>, 'target'> & {
  target: { expr: string; refId: string; interval?: string };
  titleFormat?: string;
  textFormat?: string;
  tagKeys?: string;
  useValueForTime?: boolean;
};

export type CheckedDashboard = Omit<Literal<Dashboard>, 'panels' | 'annotations'> & {
  panels: CheckedPanel[];
  annotations?: { list?: PromAnnotation[] };
};
