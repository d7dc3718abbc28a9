// Tuning spaces: declaration, constrained enumeration, config identities and key bucketing.
#include "runtime/tuning_space.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace tilejit::runtime {

// ---- configs ---------------------------------------------------------------------------------

std::optional<int64_t> TuningConfig::find(std::string_view name) const {
  for (const auto& [n, v] : values)
    if (n == name) return v;
  return std::nullopt;
}

int64_t TuningConfig::get(std::string_view name) const {
  if (auto v = find(name)) return *v;
  throw std::out_of_range(fmt::format("tilejit: tuning config '{}' has no parameter {}", id(), name));
}

std::string TuningConfig::id() const {
  std::vector<std::string> parts;
  for (const auto& [n, v] : values) parts.push_back(fmt::format("{}={}", n, v));
  return fmt::format("{}", fmt::join(parts, ","));
}

lang::Meta TuningConfig::meta() const {
  lang::Meta m;
  for (const auto& [n, v] : values)
    if (n != kWarpsParam && n != kStagesParam && n != kMinProgramsParam) m.push_back({n, v});
  return m;
}

jit::CompileOptions TuningConfig::options(jit::CompileOptions base) const {
  if (auto w = find(kWarpsParam)) base.num_warps = static_cast<int>(*w);
  if (auto s = find(kStagesParam)) base.pipeline.stages = static_cast<int>(*s);
  if (auto p = find(kMinProgramsParam)) base.min_programs_per_sm = static_cast<int>(*p);
  return base;
}

TuningConfig parse_config(std::string_view id) {
  TuningConfig c;
  size_t start = 0;
  while (start < id.size()) {
    size_t comma = id.find(',', start);
    std::string_view kv = id.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    start = comma == std::string_view::npos ? id.size() : comma + 1;
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos || eq == 0)
      throw std::invalid_argument(fmt::format("tilejit: tuning config '{}': '{}' is not NAME=VALUE", id, kv));
    std::string value(kv.substr(eq + 1));
    try {
      size_t used = 0;
      long long v = std::stoll(value, &used);
      if (used != value.size()) throw std::invalid_argument("trailing");
      c.values.push_back({std::string(kv.substr(0, eq)), v});
    } catch (const std::exception&) {
      throw std::invalid_argument(fmt::format("tilejit: tuning config '{}': '{}' is not an integer", id, value));
    }
  }
  return c;
}

// ---- bucketing -------------------------------------------------------------------------------

int64_t Bucketing::apply(int64_t v) const {
  v = std::max(v, min);
  int64_t b = v;
  switch (kind) {
    case Kind::Exact: break;
    case Kind::NextPowerOfTwo: {
      b = 1;
      while (b < v && b < (int64_t{1} << 62)) b <<= 1;
      break;
    }
    case Kind::RoundUp: {
      int64_t s = std::max<int64_t>(step, 1);
      b = (v + s - 1) / s * s;
      break;
    }
  }
  return std::min(b, max);
}

std::string Bucketing::describe() const {
  std::string s = kind == Kind::Exact ? "exact" : kind == Kind::NextPowerOfTwo ? "pow2" : fmt::format("round up to {}", step);
  if (kind != Kind::Exact && min > 1) s += fmt::format(", at least {}", min);
  if (max != std::numeric_limits<int64_t>::max()) s += fmt::format(", at most {}", max);
  return s;
}

int64_t shape_get(const Shape& s, std::string_view name) {
  for (const auto& [n, v] : s)
    if (n == name) return v;
  throw std::out_of_range(fmt::format("tilejit: shape '{}' has no dimension {}", describe_shape(s), name));
}

std::string describe_shape(const Shape& s) {
  std::vector<std::string> parts;
  for (const auto& [n, v] : s) parts.push_back(fmt::format("{}={}", n, v));
  return fmt::format("{}", fmt::join(parts, ","));
}

// ---- context ---------------------------------------------------------------------------------

int64_t TuningContext::meta_int(std::string_view name, int64_t fallback) const {
  for (const auto& [n, v] : fixed)
    if (n == name) {
      if (const int64_t* i = std::get_if<int64_t>(&v)) return *i;
      if (const bool* b = std::get_if<bool>(&v)) return *b ? 1 : 0;
    }
  return fallback;
}

bool TuningContext::meta_bool(std::string_view name, bool fallback) const {
  for (const auto& [n, v] : fixed)
    if (n == name) {
      if (const bool* b = std::get_if<bool>(&v)) return *b;
      if (const int64_t* i = std::get_if<int64_t>(&v)) return *i != 0;
    }
  return fallback;
}

lang::Meta layer_meta(const lang::Meta& over, const lang::Meta& under) {
  lang::Meta out = over;
  for (const auto& [n, v] : under)
    if (std::none_of(over.begin(), over.end(), [&](const auto& m) { return m.first == n; })) out.push_back({n, v});
  return out;
}

std::string describe_fixed_meta(const lang::Meta& m) {
  std::vector<std::string> parts;
  for (const auto& [n, v] : m) parts.push_back(fmt::format("{}={}", n, ir::to_string(v)));
  std::sort(parts.begin(), parts.end());
  return fmt::format("{}", fmt::join(parts, ","));
}

// ---- the space -------------------------------------------------------------------------------

TuningSpace::TuningSpace(std::string kernel, const lang::Kernel& (*build)()) : kernel_(std::move(kernel)), build_(build) {}

TuningSpace& TuningSpace::param(std::string name, std::vector<int64_t> values) {
  if (values.empty()) throw std::invalid_argument(fmt::format("tilejit: tuning space of '{}': parameter {} has no values", kernel_, name));
  for (const auto& p : params_)
    if (p.first == name) throw std::invalid_argument(fmt::format("tilejit: tuning space of '{}': parameter {} declared twice", kernel_, name));
  params_.push_back({std::move(name), std::move(values)});
  return *this;
}

TuningSpace& TuningSpace::param_bool(std::string name) {
  bool_params_.push_back(name);
  return param(std::move(name), {0, 1});
}

lang::Meta TuningSpace::meta_of(const TuningConfig& c) const {
  lang::Meta m = c.meta();
  for (auto& [name, value] : m)
    if (std::find(bool_params_.begin(), bool_params_.end(), name) != bool_params_.end())
      if (const int64_t* v = std::get_if<int64_t>(&value)) value = *v != 0;
  return m;
}

TuningSpace& TuningSpace::constrain(std::string description, std::function<bool(const TuningConfig&, const TuningContext&)> holds) {
  constraints_.push_back({std::move(description), std::move(holds)});
  return *this;
}

TuningSpace& TuningSpace::key(std::string name, Bucketing b, std::function<int64_t(std::span<const DeviceArg>, const lang::Meta&)> extract) {
  key_.push_back({std::move(name), b, std::move(extract)});
  return *this;
}

TuningSpace& TuningSpace::default_config(TuningConfig c) {
  default_ = std::move(c);
  return *this;
}
TuningSpace& TuningSpace::default_for(std::function<TuningConfig(const TuningContext&)> f) {
  default_for_ = std::move(f);
  return *this;
}
TuningSpace& TuningSpace::workload(std::function<Workload(const TuningConfig&, const TuningContext&)> w) {
  workload_ = std::move(w);
  return *this;
}
TuningSpace& TuningSpace::problem(std::function<ProblemData(const TuningContext&)> make) {
  problem_ = std::move(make);
  return *this;
}
TuningSpace& TuningSpace::grid(std::function<Grid(const TuningConfig&, const TuningContext&)> g) {
  grid_ = std::move(g);
  return *this;
}

size_t TuningSpace::size() const {
  if (params_.empty()) return 0;
  size_t n = 1;
  for (const auto& p : params_) n *= p.second.size();
  return n;
}

std::optional<std::string> TuningSpace::violated(const TuningConfig& c, const TuningContext& ctx) const {
  for (const Constraint& k : constraints_)
    if (!k.holds(c, ctx)) return k.description;
  return std::nullopt;
}

std::vector<TuningConfig> TuningSpace::enumerate(const TuningContext& ctx, std::vector<RejectedConfig>* rejected) const {
  if (params_.empty()) throw std::invalid_argument(fmt::format("tilejit: tuning space of '{}' declares no parameters", kernel_));
  for (const auto& [name, values] : params_)
    if (!default_.find(name))
      throw std::invalid_argument(fmt::format("tilejit: tuning space of '{}': the default config '{}' has no value for {}",
                                              kernel_, default_.id(), name));
  std::vector<TuningConfig> out;
  std::vector<size_t> idx(params_.size(), 0);
  for (;;) {
    TuningConfig c;
    for (size_t i = 0; i < params_.size(); ++i) c.values.push_back({params_[i].first, params_[i].second[idx[i]]});
    if (auto why = violated(c, ctx)) {
      if (rejected) rejected->push_back({std::move(c), *why});
    } else {
      out.push_back(std::move(c));
    }
    size_t d = params_.size();
    while (d > 0) {
      --d;
      if (++idx[d] < params_[d].second.size()) break;
      idx[d] = 0;
      if (d == 0) return out;
    }
  }
}

std::string TuningSpace::bucket(const Shape& shape) const {
  std::vector<std::string> parts;
  for (const KeyArg& k : key_) {
    auto it = std::find_if(shape.begin(), shape.end(), [&](const auto& s) { return s.first == k.name; });
    if (it == shape.end())
      throw std::invalid_argument(fmt::format("tilejit: kernel '{}': the tuning key needs dimension {} but the shape is '{}'",
                                              kernel_, k.name, describe_shape(shape)));
    parts.push_back(fmt::format("{}={}", k.name, k.bucketing.apply(it->second)));
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

Shape TuningSpace::shape_of(std::span<const DeviceArg> args, const lang::Meta& fixed) const {
  Shape s;
  for (const KeyArg& k : key_) {
    if (!k.extract)
      throw std::logic_error(fmt::format("tilejit: kernel '{}': key dimension {} has no extractor from arguments", kernel_, k.name));
    s.push_back({k.name, k.extract(args, fixed)});
  }
  return s;
}

Workload TuningSpace::workload_of(const TuningConfig& c, const TuningContext& ctx) const {
  if (!workload_) throw std::logic_error(fmt::format("tilejit: tuning space of '{}' declares no workload (cost model input)", kernel_));
  return workload_(c, ctx);
}

ProblemData TuningSpace::make_problem(const TuningContext& ctx) const {
  if (!problem_) throw std::logic_error(fmt::format("tilejit: tuning space of '{}' declares no problem inputs for timing", kernel_));
  return problem_(ctx);
}

Grid TuningSpace::grid_of(const TuningConfig& c, const TuningContext& ctx) const {
  if (!grid_) throw std::logic_error(fmt::format("tilejit: tuning space of '{}' declares no grid", kernel_));
  return grid_(c, ctx);
}

ir::Function TuningSpace::build_ir(const TuningConfig& c, const lang::Meta& fixed) const {
  return kernel().build(layer_meta(meta_of(c), fixed));
}

}  // namespace tilejit::runtime
