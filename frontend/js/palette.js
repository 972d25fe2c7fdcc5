// The chart colours, in order: a run page's series and a comparison's runs take them in turn.
export const PALETTE = ["#d3542f", "#2f5bd3", "#1f8a4c", "#8e44ad", "#b7791f", "#0f8b8d", "#c2366b", "#5d6d7e", "#7a9a01", "#a0522d"];

export function colourAt(i) {
  return PALETTE[i % PALETTE.length];
}
