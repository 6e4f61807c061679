// `smelt train`: run the job and print the summary line.
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "train/trainer.h"

namespace smelt {

int run_train(const JobConfig& config) {
  TrainResult r = train(config, std::cout);
  char line[512];
  std::snprintf(line, sizeof line,
                "smelt: trained %s for %lld steps in %.1f s: loss %.4f -> %.4f", config.model.flavor.c_str(),
                (long long)r.steps, r.seconds, r.first_loss, r.final_loss);
  std::string summary = line;
  if (r.final_validation_loss >= 0) {
    std::snprintf(line, sizeof line, ", validation %.4f -> %.4f", r.first_validation_loss, r.final_validation_loss);
    summary += line;
  }
  std::snprintf(line, sizeof line, ", median %.0f tokens/s (%.3f TFLOPS), run folder %s", r.median_tokens_per_second,
                r.median_tflops, r.run_folder.c_str());
  summary += line;
  std::cout << summary << std::endl;
  return 0;
}

}  // namespace smelt
