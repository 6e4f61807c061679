// The memory timeline of a StepPlan: every buffer's lifetime across the steps of one
// training step, as JSON for tools and as a self-contained HTML page (inline SVG and
// script, no network) drawing stacked areas with the buffer under the pointer described.
#pragma once
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "plan/step_plan.h"

namespace smelt {

// {"steps": [names], "classes": [names], "arena_bytes", "peak_step", "title",
//  "buffers": [{"name", "bytes", "dtype", "shape", "class", "first_step", "last_step",
//               "offset", "made_by"}]}; made_by is the step that first writes the buffer,
// or "persistent" for state that lives across steps.
nlohmann::json memory_timeline_json(const StepPlan& plan, const std::string& title);
std::string memory_timeline_html(const StepPlan& plan, const std::string& title);

// Writes the file; errors say which path could not be written.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace smelt
