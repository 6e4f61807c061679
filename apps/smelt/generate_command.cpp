// `smelt generate`: stream a sample from trained weights to stdout.
#include <iostream>

#include "commands.h"
#include "train/generate.h"

namespace smelt {

int run_generate(const GenerateOptions& options) {
  std::cout << options.prompt << std::flush;
  generate(options, [](const std::string& piece) { std::cout << piece << std::flush; });
  std::cout << std::endl;
  return 0;
}

}  // namespace smelt
