// Chrome traces: one span per plan step on the compute-stream track, in plan order, and the
// collectives' windows on a communication-stream track of their own.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/random.h"
#include "dist/sharded_fixture.h"
#include "support/fresh_random.h"
#include "support/temporary_folder.h"
#include "train/trace.h"

namespace smelt {
namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

bool is_collective(StepKind kind) {
  return kind == StepKind::all_gather || kind == StepKind::reduce_scatter || kind == StepKind::all_reduce_loss ||
         kind == StepKind::all_reduce_gradient_norm;
}

TEST(ChromeTrace, CollectivesGetACommunicationTrackAtTheirOwnTimes) {
  const ModelConfig model = testing::small_model(2);
  testing::ShardedCase c;
  c.shard_single_rank = true;
  auto backend = make_cpu_backend();
  const StepPlan plan = build_step_plan(model, testing::sharded_plan_options(model, c, 2, 1, *backend));
  Random random(testing_support::fresh(2026), 12);
  std::vector<double> ms(plan.steps.size());
  for (double& m : ms) m = 0.05 + random.uniform();
  std::vector<std::pair<double, double>> windows(plan.steps.size(), {-1.0, -1.0});
  std::vector<size_t> timed;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    if (!is_collective(plan.steps[i].kind)) continue;
    const double start = 10 * random.uniform();
    windows[i] = {start, start + random.uniform()};
    timed.push_back(i);
  }
  ASSERT_GT(timed.size(), 4u);
  windows[timed.back()] = {2.0, 1.0};  // ends before it starts: not drawn
  const testing_support::TemporaryFolder temporary;  // removed with what it holds, however the test ends
  const fs::path folder = temporary.path();

  write_chrome_trace((folder / "with.json").string(), plan, ms, windows);
  const nlohmann::json with = read_json(folder / "with.json");
  std::vector<nlohmann::json> compute, communication;
  bool named = false;
  for (const auto& e : with["traceEvents"]) {
    if (e["ph"] == "M" && e.contains("tid") && e["tid"] == 2) named = e["args"]["name"] == "communication stream";
    if (e["ph"] != "X") continue;
    (e["tid"] == 1 ? compute : communication).push_back(e);
  }
  EXPECT_TRUE(named);
  ASSERT_EQ(compute.size(), plan.steps.size());
  double at = 0;
  for (size_t i = 0; i < compute.size(); ++i) {  // plan order, back to back, with each step's time
    EXPECT_EQ(compute[i]["name"], plan.steps[i].name());
    EXPECT_NEAR(compute[i]["ts"].get<double>(), at, 1e-6);
    EXPECT_NEAR(compute[i]["dur"].get<double>(), ms[i] * 1e3, 1e-6);
    at += ms[i] * 1e3;
  }
  ASSERT_EQ(communication.size(), timed.size() - 1);
  for (size_t k = 0; k + 1 < timed.size(); ++k) {
    const size_t i = timed[k];
    EXPECT_EQ(communication[k]["name"], plan.steps[i].name());
    EXPECT_EQ(communication[k]["args"]["step"], i);
    EXPECT_NEAR(communication[k]["ts"].get<double>(), windows[i].first * 1e3, 1e-6);
    EXPECT_NEAR(communication[k]["dur"].get<double>(), (windows[i].second - windows[i].first) * 1e3, 1e-6);
  }

  // Without windows (the CPU's ranks as threads, unsharded plans): no communication track.
  write_chrome_trace((folder / "without.json").string(), plan, ms);
  const nlohmann::json without = read_json(folder / "without.json");  // kept alive while iterated
  for (const auto& e : without["traceEvents"]) {
    if (e.contains("tid")) {
      EXPECT_EQ(e["tid"], 1) << e.dump();
    }
  }
}

// The summary's lines: each op kind's measured and predicted time summed over its blocks, the
// measured over the predicted, and the totals; without a prediction, none of those columns.
TEST(TraceSummary, SetsEachOpsMeasuredTimeAgainstItsPrediction) {
  const ModelConfig model = testing::small_model(3);
  auto backend = make_cpu_backend();
  testing::ShardedCase c;
  const StepPlan plan = build_step_plan(model, testing::sharded_plan_options(model, c, 1, 1, *backend));
  Random random(testing_support::fresh(2027), 13);
  std::vector<double> ms(plan.steps.size()), predicted(plan.steps.size());
  for (size_t i = 0; i < ms.size(); ++i) ms[i] = 0.05 + random.uniform(), predicted[i] = 0.05 + random.uniform();
  const std::string kind = "backward attention.sdpa";
  double measured_sum = 0, predicted_sum = 0, measured_total = 0, predicted_total = 0;
  int blocks = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    measured_total += ms[i], predicted_total += predicted[i];
    if (plan.steps[i].kind != StepKind::layer_backward ||
        plan.steps[i].op != static_cast<uint8_t>(BackwardOp::attention))
      continue;
    measured_sum += ms[i], predicted_sum += predicted[i], ++blocks;
  }
  ASSERT_EQ(blocks, 3);

  // The numbers after a line's name, from the line that starts with `name`.
  auto numbers_of = [](const std::string& summary, const std::string& name) {
    std::istringstream lines(summary);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind(name + " ", 0) != 0) continue;
      std::istringstream rest(line.substr(name.size()));
      std::vector<double> numbers;
      std::string word;
      while (rest >> word) numbers.push_back(std::strtod(word.c_str(), nullptr));
      return numbers;
    }
    ADD_FAILURE() << "no line '" << name << "' in\n" << summary;
    return std::vector<double>{};
  };
  const std::string with = trace_summary(plan, ms, predicted);
  EXPECT_NE(with.find("predicted"), std::string::npos) << with;
  // ms, share %, count, TFLOPS, predicted, ratio
  const std::vector<double> line = numbers_of(with, kind);
  ASSERT_EQ(line.size(), 6u) << with;
  EXPECT_NEAR(line[0], measured_sum, 1e-3);
  EXPECT_EQ(line[2], 3);
  EXPECT_NEAR(line[4], predicted_sum, 1e-3);
  EXPECT_NEAR(line[5], measured_sum / predicted_sum, 6e-3);
  const std::vector<double> total = numbers_of(with, "total");
  ASSERT_EQ(total.size(), 3u) << with;
  EXPECT_NEAR(total[0], measured_total, 1e-3);
  EXPECT_NEAR(total[1], predicted_total, 1e-3);
  EXPECT_NEAR(total[2], measured_total / predicted_total, 6e-3);

  const std::string without = trace_summary(plan, ms);
  EXPECT_EQ(without.find("predicted"), std::string::npos) << without;
  EXPECT_EQ(numbers_of(without, kind).size(), 4u) << without;
  EXPECT_EQ(numbers_of(without, "total").size(), 1u) << without;
}

}  // namespace
}  // namespace smelt
