// `smelt bench`: time a config's training step; with --matrix, run a grid of
// configurations (one process per cell) and print them side by side.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "dist/launch_environment.h"
#include "plan/plan_report.h"
#include "train/benchmark.h"
#include "train/metrics.h"
#include "train/reference_runs.h"

extern char** environ;

namespace smelt {

namespace {

struct Axis {
  std::string name;
  std::vector<std::string> values;
};

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator))
    if (!part.empty()) parts.push_back(part);
  return parts;
}

std::vector<Axis> parse_matrix(const std::string& spec) {
  std::vector<Axis> axes;
  std::istringstream in(spec);
  std::string word;
  while (in >> word) {
    auto eq = word.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == word.size())
      fail(ErrorKind::config, "--matrix: expected axis=value,value,... but found '" + word +
                                  "' (axes: precision, ac, batch, seq, layers, fusion, or any section.key)");
    axes.push_back({word.substr(0, eq), split(word.substr(eq + 1), ',')});
  }
  if (axes.empty()) fail(ErrorKind::config, "--matrix is empty; example: --matrix \"precision=bf16 ac=none,selective-op\"");
  return axes;
}

// The config overrides one axis value stands for.
std::vector<std::string> overrides_for(const std::string& axis, const std::string& value) {
  if (axis == "precision") {
    if (value == "f32" || value == "float32") return {"training.mixed_precision_param=float32", "float8.recipe=none"};
    if (value == "bf16" || value == "bfloat16") return {"training.mixed_precision_param=bfloat16", "float8.recipe=none"};
    if (value.rfind("fp8-", 0) == 0) return {"training.mixed_precision_param=bfloat16", "float8.recipe=" + value.substr(4)};
    fail(ErrorKind::config, "--matrix precision: expected f32, bf16 or fp8-<recipe>, found '" + value + "'");
  }
  if (axis == "ac") return {"activation_checkpoint.mode=" + value};
  if (axis == "batch") return {"training.local_batch_size=" + value};
  if (axis == "seq") return {"training.seq_len=" + value};
  if (axis == "layers") return {"model.n_layers=" + value};
  if (axis == "fusion") return {"float8.fusion=" + value};
  if (axis.find('.') != std::string::npos) return {axis + "=" + value};
  fail(ErrorKind::config, "--matrix: unknown axis '" + axis + "' (precision, ac, batch, seq, layers, fusion, or section.key)");
}

int run_child(const std::vector<std::string>& arguments) {
  std::vector<char*> argv;
  for (const auto& a : arguments) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string table_row(const std::string& cell, const BenchResult* r, const std::string& failure) {
  char line[400];
  if (!r) {
    std::snprintf(line, sizeof line, "| %-52s | %s |\n", cell.c_str(), failure.c_str());
    return line;
  }
  char clock[16] = "-", power[16] = "-", energy[16] = "-";  // the GPU while timed (zero: not sampled)
  if (r->sm_clock_mhz > 0) std::snprintf(clock, sizeof clock, "%.0f", r->sm_clock_mhz);
  if (r->power_watts > 0) std::snprintf(power, sizeof power, "%.0f", r->power_watts);
  if (r->joules_per_step > 0) std::snprintf(energy, sizeof energy, "%.1f", r->joules_per_step);
  // The reference run beside it (--reference): its tokens/s, ours over it, its peak memory.
  char reference[16] = "-", ratio[16] = "-", reference_gb[16] = "-";
  if (r->has_reference()) {
    std::snprintf(reference, sizeof reference, "%.0f", r->reference->tokens_per_second);
    std::snprintf(ratio, sizeof ratio, "%.2f", r->tokens_per_second / r->reference->tokens_per_second);
    if (r->reference->peak_gb > 0) std::snprintf(reference_gb, sizeof reference_gb, "%.1f", r->reference->peak_gb);
  }
  std::snprintf(line, sizeof line,
                "| %-52s | %10.0f | %7.1f | %5.1f%% | %8.1f | %9.2f | %9.2f | %6s | %4s | %6s | %9s | %5s | %6s |\n",
                cell.c_str(), r->tokens_per_second, r->tflops, r->mfu_percent, r->step_ms, r->predicted_bytes / 1e9,
                r->measured_bytes / 1e9, clock, power, energy, reference, ratio, reference_gb);
  return line;
}

const char* kTableHeader =
    "| configuration                                        | tokens/s   | TFLOPS  | MFU    | step ms  | plan GB   | driver GB | SM MHz | W    | J/step | reference | ratio | ref GB |\n"
    "|------------------------------------------------------|-----------:|--------:|-------:|---------:|----------:|----------:|-------:|-----:|-------:|----------:|------:|-------:|\n";

// Below the table: what the reference column's runs were (each distinct source once).
std::string reference_notes(const std::vector<BenchResult>& results) {
  std::vector<std::string> sources;
  for (const auto& r : results)
    if (r.has_reference() && std::find(sources.begin(), sources.end(), r.reference_source) == sources.end())
      sources.push_back(r.reference_source);
  std::string notes;
  for (const auto& source : sources) notes += "reference: " + source + "; ratio = tokens/s over the reference's\n";
  return notes;
}

}  // namespace

int run_bench(const JobConfig& config, const BenchCommandOptions& options, const ConfigOptions& config_options) {
  BenchOptions bench;
  bench.steps = options.steps;
  bench.warmup = options.warmup;
  bench.trace_path = options.trace;
  bench.calibrate_path = options.calibrate;
  bench.reference_path = options.reference;
  if (!options.calibrate.empty() && options.trace.empty())
    fail(ErrorKind::config, "--calibrate needs --trace: the per-op times come from the traced steps");
  if (!options.trace.empty() && !options.matrix.empty())
    fail(ErrorKind::config, "--trace applies to one configuration; run it without --matrix");
  // A launch of several ranks (RANK / WORLD_SIZE, as for train): every rank runs each step with
  // its collectives; rank 0 alone prints, writes the results and the trace.
  bench.report = read_launch_environment().rank == 0;
  std::ostream quiet(nullptr);
  std::ostream& out = bench.report ? std::cout : quiet;
  const std::string output = options.output.empty() ? (std::filesystem::path(config.job.dump_folder) / "bench.json").string()
                                                     : options.output;
  if (bench.report)
    std::filesystem::create_directories(std::filesystem::path(output).parent_path().empty()
                                            ? std::filesystem::path(".")
                                            : std::filesystem::path(output).parent_path());
  if (options.matrix.empty()) {
    BenchResult r = run_benchmark(config, bench, out);
    if (!bench.report) return 0;
    write_file_atomically(output, bench_to_json(r).dump(2) + "\n");
    std::cout << "\n" << kTableHeader << table_row(r.label, &r, "") << reference_notes({r}) << "results: " << output << "\n";
    return 0;
  }

  // Grid: the cartesian product of the axes, each cell in its own process.
  std::vector<Axis> axes = parse_matrix(options.matrix);
  if (!options.reference.empty() && options.reference != "none") load_reference_table(options.reference);  // fails before any cell
  for (const auto& axis : axes)
    for (const auto& value : axis.values) overrides_for(axis.name, value);  // validate before running anything
  std::vector<std::vector<size_t>> cells{{}};
  for (const auto& axis : axes) {
    std::vector<std::vector<size_t>> next;
    for (const auto& cell : cells)
      for (size_t v = 0; v < axis.values.size(); ++v) {
        auto c = cell;
        c.push_back(v);
        next.push_back(c);
      }
    cells = next;
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string scratch = output + ".cells";
  if (bench.report) std::filesystem::create_directories(scratch);
  std::string table = kTableHeader;
  std::vector<BenchResult> results;
  nlohmann::json all = nlohmann::json::array();
  for (size_t index = 0; index < cells.size(); ++index) {
    std::vector<std::string> args = {self, "bench"};
    if (!config_options.config_path.empty()) args.insert(args.end(), {"--config", config_options.config_path});
    for (const auto& o : config_options.overrides) args.push_back("--" + o);
    std::string name;
    for (size_t a = 0; a < axes.size(); ++a) {
      const auto& value = axes[a].values[cells[index][a]];
      name += (name.empty() ? "" : " ") + axes[a].name + "=" + value;
      for (const auto& o : overrides_for(axes[a].name, value)) args.push_back("--" + o);
    }
    const std::string cell_file = scratch + "/cell" + std::to_string(index) + ".json";
    if (bench.report) std::filesystem::remove(cell_file);
    args.insert(args.end(), {"--steps", std::to_string(bench.steps), "--warmup", std::to_string(bench.warmup), "--output", cell_file});
    if (!options.reference.empty()) args.insert(args.end(), {"--reference", options.reference});
    out << "\n=== cell " << index + 1 << "/" << cells.size() << ": " << name << "\n" << std::flush;
    const int code = run_child(args);
    if (!bench.report) continue;  // the cell's child on this rank joined rank 0's
    if (code == 0 && std::filesystem::exists(cell_file)) {
      std::ifstream in(cell_file);
      nlohmann::json j = nlohmann::json::parse(in);
      BenchResult r = bench_from_json(j);
      j["cell"] = name;
      all.push_back(j);
      table += table_row(name, &r, "");
      results.push_back(r);
    } else {
      all.push_back({{"cell", name}, {"error", code}});
      table += table_row(name, nullptr, "failed (exit code " + std::to_string(code) + ", see its output above)");
    }
  }
  if (!bench.report) return 0;
  write_file_atomically(output, all.dump(2) + "\n");
  std::filesystem::remove_all(scratch);
  std::cout << "\n" << table << reference_notes(results) << "results: " << output << "\n";
  return 0;
}

}  // namespace smelt
