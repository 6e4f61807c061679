// Chrome trace files and per-op time summaries.
#include "train/trace.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "train/metrics.h"

namespace smelt {

namespace {

const char* phase_name(StepKind kind) {
  switch (kind) {
    case StepKind::layer_recompute: return "recompute";
    case StepKind::layer_backward:
    case StepKind::final_norm_backward:
    case StepKind::embedding_backward: return "backward";
    case StepKind::gradient_norm:
    case StepKind::optimizer:
    case StepKind::cast_weights: return "optimizer";
    case StepKind::output_head:
    case StepKind::loss_reduce: return "loss";
    default: return "forward";
  }
}

// "backward layers.3.attention.wq" -> "backward attention.wq"
std::string op_kind(const std::string& name) {
  const auto at = name.find("layers.");
  if (at == std::string::npos) return name;
  const auto dot = name.find('.', at + 7);
  return name.substr(0, at) + name.substr(dot + 1);
}

}  // namespace

void write_chrome_trace(const std::string& path, const StepPlan& plan, const std::vector<double>& ms,
                        const std::vector<std::pair<double, double>>& collective_windows) {
  nlohmann::json events = nlohmann::json::array();
  double start_us = 0;
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"args", {{"name", "smelt training step"}}}});
  events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", 1}, {"args", {{"name", "compute stream"}}}});
  // The collectives as they ran on the communication stream, on a track of their own (their
  // steps on the compute track are the issue and any waits).
  bool communication_track = false;
  for (size_t i = 0; i < plan.steps.size() && i < collective_windows.size(); ++i) {
    const auto [first, last] = collective_windows[i];
    if (first < 0 || last < first) continue;
    if (!communication_track)
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", 2}, {"args", {{"name", "communication stream"}}}});
    communication_track = true;
    events.push_back({{"ph", "X"}, {"name", plan.steps[i].name()}, {"cat", "communication"}, {"pid", 1}, {"tid", 2},
                      {"ts", first * 1e3}, {"dur", (last - first) * 1e3}, {"args", {{"step", i}}}});
  }
  for (size_t i = 0; i < plan.steps.size() && i < ms.size(); ++i) {
    const auto& step = plan.steps[i];
    const double duration_us = ms[i] * 1e3;
    nlohmann::json args = {{"step", i}, {"flops", step.flops}};
    if (step.flops > 0 && ms[i] > 0) args["tflops"] = step.flops / (ms[i] * 1e-3) / 1e12;
    if (step.layer >= 0) args["layer"] = step.layer;
    events.push_back({{"ph", "X"}, {"name", step.name()}, {"cat", phase_name(step.kind)}, {"pid", 1}, {"tid", 1},
                      {"ts", start_us}, {"dur", duration_us}, {"args", args}});
    start_us += duration_us;
  }
  nlohmann::json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  write_file_atomically(path, trace.dump() + "\n");
}

std::string trace_summary(const StepPlan& plan, const std::vector<double>& ms, const std::vector<double>& predicted) {
  struct Total {
    double ms = 0, predicted = 0, flops = 0;
    int count = 0;
  };
  const bool with_prediction = !predicted.empty() && predicted.size() == ms.size();
  std::map<std::string, Total> totals;
  Total all;
  for (size_t i = 0; i < plan.steps.size() && i < ms.size(); ++i) {
    auto& t = totals[op_kind(plan.steps[i].name())];
    const double expected = with_prediction ? predicted[i] : 0.0;
    t.ms += ms[i], all.ms += ms[i];
    t.predicted += expected, all.predicted += expected;
    t.flops += plan.steps[i].flops;
    ++t.count;
  }
  std::vector<std::pair<std::string, Total>> sorted(totals.begin(), totals.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  // "predicted" and "ratio" (measured over predicted) close the line when there is a prediction.
  auto prediction = [&](const Total& t) -> std::string {
    if (!with_prediction) return "";
    char text[64];
    if (t.predicted > 0) std::snprintf(text, sizeof text, " %9.3f %6.2f", t.predicted, t.ms / t.predicted);
    else std::snprintf(text, sizeof text, " %9.3f %6s", t.predicted, "");
    return text;
  };
  std::string out;
  char line[320];
  std::snprintf(line, sizeof line, "%-44s %9s %6s %6s %9s%s\n", "op (summed over blocks)", "ms", "share", "count", "TFLOPS",
                with_prediction ? " predicted  ratio" : "");
  out += line;
  for (const auto& [name, t] : sorted) {
    char tflops[32] = "";
    if (t.flops > 0 && t.ms > 0) std::snprintf(tflops, sizeof tflops, "%9.1f", t.flops / (t.ms * 1e-3) / 1e12);
    std::snprintf(line, sizeof line, "%-44s %9.3f %5.1f%% %6d %9s%s\n", name.c_str(), t.ms, 100 * t.ms / all.ms, t.count,
                  tflops, prediction(t).c_str());
    out += line;
  }
  if (with_prediction)  // the prediction under its column
    std::snprintf(line, sizeof line, "%-44s %9.3f %6s %6s %9s%s\n", "total", all.ms, "", "", "", prediction(all).c_str());
  else
    std::snprintf(line, sizeof line, "%-44s %9.3f\n", "total", all.ms);
  return out + line;
}

}  // namespace smelt
