// --config and `--section.key=value` overrides for every subcommand.
#include "cli_common.h"

#include "core/error.h"

namespace smelt {

void add_config_options(CLI::App& command, ConfigOptions& options) {
  command.add_option("--config", options.config_path, "TOML config file (default: the built-in debug model on CPU)");
  command.allow_extras();
  command.footer("Any config key can be overridden as --section.key=value, e.g. --training.steps=100 "
                 "--model.n_layers=8 --activation_checkpoint.mode=selective-op. `smelt config-keys` lists them.");
}

JobConfig resolve_config(CLI::App& command, ConfigOptions& options) {
  std::vector<std::string> extras = command.remaining();
  for (size_t i = 0; i < extras.size(); ++i) {
    const std::string& arg = extras[i];
    if (arg.rfind("--", 0) != 0 || arg.find('.') == std::string::npos)
      fail(ErrorKind::config, "unexpected argument '" + arg + "': overrides are written --section.key=value");
    std::string body = arg.substr(2);
    if (body.find('=') == std::string::npos) {
      if (i + 1 >= extras.size())
        fail(ErrorKind::config, "override '" + arg + "' has no value: write " + arg + "=VALUE");
      body += "=" + extras[++i];
    }
    options.overrides.push_back(body);
  }
  JobConfig config = options.config_path.empty() ? JobConfig{} : load_config_file(options.config_path);
  for (const auto& o : options.overrides) apply_override(config, o);
  validate_config(config);
  return config;
}

std::string config_keys_help() {
  std::string text;
  for (const auto& k : config_keys()) text += "  " + k.key + " (" + k.type + "): " + k.help + "\n";
  return text;
}

}  // namespace smelt
