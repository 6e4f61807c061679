// `smelt eval`: the loss and perplexity of trained weights on validation data, as a line or JSON.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "train/evaluate.h"

namespace smelt {

int run_eval(const JobConfig& config, const EvalCommandOptions& options) {
  const bool json = options.format == "json";
  // With JSON on stdout, the progress goes to stderr.
  const EvaluateResult r = evaluate(config, options.evaluate, json ? std::cerr : std::cout);
  if (json) {
    nlohmann::json j = {{"loss", r.loss},       {"perplexity", r.perplexity}, {"bits_per_token", r.bits_per_token},
                        {"batches", r.batches}, {"tokens", r.tokens},         {"all_data", r.all_data},
                        {"seconds", r.seconds}, {"tokens_per_second", r.tokens / r.seconds},
                        {"model", r.model},     {"data", r.data}};
    std::cout << j.dump(2) << std::endl;
    return 0;
  }
  char line[512];
  std::snprintf(line, sizeof line,
                "smelt: evaluated %lld tokens (%lld batches) in %.1f s (%.0f tokens/s): loss %.4f, perplexity %.2f, "
                "%.3f bits per token",
                static_cast<long long>(r.tokens), static_cast<long long>(r.batches), r.seconds, r.tokens / r.seconds,
                r.loss, r.perplexity, r.bits_per_token);
  std::cout << line << std::endl;
  return 0;
}

}  // namespace smelt
