// Start-up agreement check: every rank must run the same job configuration.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dist/communicator.h"

namespace smelt {

namespace {

// "section.key" of the first value that differs between two configs (in `mine`'s key order).
std::string first_difference(const nlohmann::json& mine, const nlohmann::json& theirs, std::string& mine_value,
                             std::string& their_value) {
  for (const auto& [section, keys] : mine.items()) {
    if (section == "source") continue;  // where the file was read from, not what it says
    if (!keys.is_object()) continue;
    for (const auto& [key, value] : keys.items()) {
      const auto their_section = theirs.find(section);
      const bool present = their_section != theirs.end() && their_section->contains(key);
      if (present && (*their_section)[key] == value) continue;
      mine_value = value.dump();
      their_value = present ? (*their_section)[key].dump() : "(missing)";
      return section + "." + key;
    }
  }
  return "";
}

}  // namespace

void check_same_config(Communicator& communicator, const std::string& config_json) {
  const std::vector<std::string> all = communicator.exchange_text(config_json);
  const nlohmann::json reference = nlohmann::json::parse(all.at(0));
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    std::string value0, value_r;
    const std::string key = first_difference(reference, nlohmann::json::parse(all[r]), value0, value_r);
    if (key.empty()) continue;  // only the source file's path differs
    fail(ErrorKind::config, "ranks disagree on the configuration: rank 0 has " + key + " = " + value0 + ", rank " +
                                std::to_string(r) + " has " + value_r +
                                "; start every rank with the same config file and overrides");
  }
}

}  // namespace smelt
