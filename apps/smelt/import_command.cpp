// `smelt import-config` (import_command.h).
#include "import_command.h"

#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "core/torchtitan_config.h"
#include "train/metrics.h"

namespace smelt {
namespace {

void report(std::ostream& out, const char* title, const std::vector<std::string>& lines) {
  if (lines.empty()) return;
  out << title << "\n";
  for (const std::string& line : lines) out << "  " << line << "\n";
}

}  // namespace

int run_import_config(const ImportCommandOptions& options) {
  if (!options.output.empty()) {
    std::error_code status;
    if (std::filesystem::exists(options.output, status) && !options.force)
      fail(ErrorKind::input, "--output '" + options.output + "' exists; choose another name, or pass --force to "
                                 "overwrite it");
    if (std::filesystem::is_directory(options.output, status))
      fail(ErrorKind::input, "--output '" + options.output + "' is a folder; expected a .toml file name");
    const std::filesystem::path folder = std::filesystem::path(options.output).parent_path();
    if (!folder.empty() && !std::filesystem::is_directory(folder, status))
      fail(ErrorKind::input, "--output '" + options.output + "': its folder '" + folder.string() +
                                 "' does not exist; create it first");
  }
  const TorchtitanImport imported = import_torchtitan_config(options.from);  // throws before anything is written
  if (!options.output.empty()) write_file_atomically(options.output, imported.toml);
  std::ostream& out = options.output.empty() ? std::cerr : std::cout;
  report(out, "translated:", imported.translated);
  report(out, "torchtitan defaults written (smelt's differ):", imported.defaults);
  report(out, "set aside (no effect in smelt):", imported.set_aside);
  report(out, "check:", imported.warnings);
  if (options.output.empty())
    std::cout << imported.toml;
  else
    out << "wrote " << options.output << " (smelt plan --config " << options.output << " shows its memory and speed)\n";
  return 0;
}

}  // namespace smelt
