// What the page says under a reply: its figures and how it ended.

// A reply's figures, from its Stats (the same dict `localspec run --json` prints); the tokens by source
// are those the colours show.
export function figures(st) {
  if (!st || !st.tokens) return "";
  const parts = [`${st.tokens} tokens`];
  if (st.generation_s > 0) parts.push(`${(st.tokens / st.generation_s).toFixed(1)} tok/s`);
  if (st.drafted) {
    parts.push(`drafted ${st.drafted}, accepted ${st.accepted} (${Math.round((100 * st.accepted) / st.drafted)}%)`);
    const by = st.tokens_by_source || {};
    const from = [["model", "draft model"], ["ngram", "n-gram or prediction"], ["mtp", "NextN head"], ["target", "target"]]
      .filter(([k]) => by[k]).map(([k, name]) => `${by[k]} ${name}`);
    if (from.length) parts.push("from " + from.join(", "));
  } else {
    parts.push(st.spec_mode === "off" ? "speculation off" : "nothing drafted");
  }
  if (st.prediction_tokens) parts.push(`${st.prediction_accepted} of the prediction's ${st.prediction_tokens} tokens accepted`);
  if (st.speedup_estimate) parts.push(`≈${st.speedup_estimate.toFixed(2)}× vs plain (est.)`);
  return parts.join(" · ");
}

export function note(m) {
  if (m.error) return "failed: " + m.error;
  if (m.complete === false) return "cut off";
  return { cancelled: "stopped", length: "stopped at the token limit", context: "the context is full" }[m.stop_reason] || "";
}
