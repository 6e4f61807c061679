// The memory timeline: every buffer with its lifetime, size, shape and maker; the HTML page
// carries the same data inline and loads nothing from the network.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "plan/memory_timeline.h"
#include "support/model_shapes.h"

namespace smelt {
namespace {

StepPlan small_plan() {
  PlanOptions o;
  o.shape = {1, 1024};
  o.compute_dtype = DType::bf16;
  o.policy = parse_checkpoint_policy("selective-op");
  return build_step_plan(testing_support::llama3_8b_layers(2), o);
}

TEST(MemoryTimeline, JsonListsEveryBufferWithItsLifetime) {
  const StepPlan plan = small_plan();
  const nlohmann::json j = memory_timeline_json(plan, "test");
  ASSERT_EQ(j["buffers"].size(), plan.buffers.size());
  EXPECT_EQ(j["steps"].size(), plan.steps.size());
  EXPECT_EQ(j["arena_bytes"].get<size_t>(), plan.memory.arena_bytes);
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const auto& b = j["buffers"][i];
    EXPECT_EQ(b["name"], plan.buffers[i].request.name);
    EXPECT_EQ(b["bytes"].get<size_t>(), plan.buffers[i].request.bytes);
    EXPECT_EQ(b["first_step"].get<int>(), plan.buffers[i].request.first_step);
    EXPECT_EQ(b["offset"].get<size_t>(), plan.memory.offsets[i]);
  }
  const auto& query = j["buffers"][plan.layers[1].forward[static_cast<int>(Activation::query)]];
  EXPECT_EQ(query["made_by"], "forward layers.1.attention.wq");
  EXPECT_EQ(query["shape"], "(1024, 4096)");
  EXPECT_EQ(j["buffers"][plan.parameters]["made_by"], "persistent");
}

TEST(MemoryTimeline, HtmlIsSelfContainedAndCarriesTheData) {
  const StepPlan plan = small_plan();
  const std::string html = memory_timeline_html(plan, "a <b> title");
  for (const char* forbidden : {"<script src", "<link", "fetch(", "XMLHttpRequest", "https://", "@import"})
    EXPECT_EQ(html.find(forbidden), std::string::npos) << forbidden;
  const std::string marker = "const D = ";
  const size_t begin = html.find(marker) + marker.size(), end = html.find(";\n", begin);
  ASSERT_NE(end, std::string::npos);
  const nlohmann::json data = nlohmann::json::parse(html.substr(begin, end - begin));
  EXPECT_EQ(data, memory_timeline_json(plan, "a <b> title"));
  EXPECT_EQ(html.substr(begin, end - begin).find('<'), std::string::npos);  // cannot close the script early
}

}  // namespace
}  // namespace smelt
