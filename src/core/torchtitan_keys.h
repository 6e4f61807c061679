// torchtitan's config keys that smelt's schema lacks, and what the import makes of each
// (torchtitan_config.cpp): renamed to smelt's key, set aside, accepted at its default only, or
// resolved with other keys. One table; the lookups the import and smelt's loader ask it.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace smelt::torchtitan {

enum class Kind {
  rename,     // the same setting under smelt's name (`target`)
  set_aside,  // no effect in smelt (`why`)
  neutral,    // accepted at the values in `target` only (torchtitan's default first); else an error (`why`)
  special,    // resolved with other keys (the import's resolve_*), under `target` when it names the key's
              // other spelling ([quantize.linear.float8] recipe_name is float8.recipe_name)
};

struct TorchtitanKey {
  std::string section;  // nested tables joined with '.': "quantize.linear.float8"
  const char* key;  // "*": every key of the section
  Kind kind;
  const char* target;   // rename: smelt's section.key; neutral: the accepted values, as TOML, '|'-separated
  const char* why;      // set_aside and neutral: the reason; rename: a difference to warn about, or ""
};

// Every entry: torchtitan's releases from 2024 to its last TOML layout.
const std::vector<TorchtitanKey>& torchtitan_keys();
// The entry for section.key, else its section's "*" entry, else nullptr.
const TorchtitanKey* find_torchtitan_key(const std::string& section, const std::string& key);
// A section torchtitan has, or one holding nested sections it has ([quantize] of [quantize.linear.float8]).
bool is_torchtitan_section(const std::string& section);
// smelt's preset for torchtitan's Llama 3 flavour ("8B", "70B_flex_attn", ...), or nullopt.
std::optional<std::string> smelt_flavor(const std::string& flavor);

}  // namespace smelt::torchtitan
