// CSE and DCE over the tile IR. Keys are the op kind, operands, attributes and result types in
// the printer's canonical spelling, so two ops are merged exactly when they print alike.
#include "jit/canonicalize.hpp"

#include <fmt/format.h>

#include <map>
#include <unordered_map>

namespace tilejit::jit {
namespace {

using ir::OpKind;

// Ops whose result depends only on operands and attributes, with no effect on memory.
bool pure(const ir::Op& op) {
  switch (op.kind) {
    case OpKind::load: case OpKind::store: case OpKind::atomic_add: case OpKind::atomic_rmw: case OpKind::atomic_cas: case OpKind::block_load: case OpKind::block_store:
    case OpKind::wait_ge: case OpKind::signal_add: case OpKind::timestamp: case OpKind::turn_begin: case OpKind::turn_end: case OpKind::ring_producer:
    case OpKind::for_: case OpKind::if_: case OpKind::yield: case OpKind::warp_roles: case OpKind::channel_push: case OpKind::channel_pop:
      return false;
    default:
      return true;
  }
}

bool removable_if_unused(const ir::Op& op) {
  return pure(op) || op.kind == OpKind::load || op.kind == OpKind::block_load;
}

std::string attr_key(const ir::Attr& a) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, double>) return fmt::format("d{}", v);
        else if constexpr (std::is_same_v<T, int64_t>) return fmt::format("i{}", v);
        else if constexpr (std::is_same_v<T, std::string>) return "s" + v;
        else if constexpr (std::is_same_v<T, ir::DType>) return fmt::format("t{}", static_cast<int>(v));
        else return fmt::format("v{}", fmt::join(v, ","));
      },
      a);
}

class Cse {
 public:
  explicit Cse(ir::Function& f) : f_(f) {}
  int run() {
    block(f_.body);
    for (auto& [from, to] : replace_) ir::replace_all_uses(f_.body, from, to);
    return static_cast<int>(replace_.size());
  }

 private:
  ir::ValueId resolve(ir::ValueId v) const {
    auto it = replace_.find(v);
    return it == replace_.end() ? v : it->second;
  }

  void block(ir::Block& b) {
    scopes_.emplace_back();
    std::vector<ir::Op> kept;
    for (ir::Op& op : b.ops) {
      for (ir::ValueId& v : op.operands) v = resolve(v);
      if (pure(op) && op.regions.empty() && op.results.size() == 1) {
        std::string key = fmt::format("{}|{}|", static_cast<int>(op.kind), fmt::join(op.operands, ","));
        for (const auto& [k, a] : op.attrs) key += k + "=" + attr_key(a) + ";";
        key += ir::to_string(f_.type(op.results[0]));
        if (auto found = lookup(key, !f_.type(op.results[0]).is_scalar())) {
          replace_[op.results[0]] = *found;
          continue;
        }
        scopes_.back()[key] = op.results[0];
      }
      // A warp role sees no tile from outside (they live on other warps): only scalars merge
      // across its boundary.
      const size_t floor = tile_floor_;
      for (ir::Block& r : op.regions) {
        if (op.kind == OpKind::warp_roles) tile_floor_ = scopes_.size();
        block(r);
        tile_floor_ = floor;
      }
      kept.push_back(std::move(op));
    }
    b.ops = std::move(kept);
    scopes_.pop_back();
  }

  std::optional<ir::ValueId> lookup(const std::string& key, bool tile) const {
    for (size_t i = scopes_.size(); i-- > (tile ? tile_floor_ : 0);) {
      auto f = scopes_[i].find(key);
      if (f != scopes_[i].end()) return f->second;
    }
    return std::nullopt;
  }

  ir::Function& f_;
  std::vector<std::map<std::string, ir::ValueId>> scopes_;
  size_t tile_floor_ = 0;  // the first scope whose tiles the current block may reuse
  std::unordered_map<ir::ValueId, ir::ValueId> replace_;
};

int dce(ir::Function& f) {
  int removed = 0;
  for (bool changed = true; changed;) {
    changed = false;
    std::vector<int> uses(f.values.size(), 0);
    ir::walk(f.body, [&](const ir::Op& op) {
      for (ir::ValueId v : op.operands) ++uses[v];
    });
    std::function<void(ir::Block&)> sweep = [&](ir::Block& b) {
      std::vector<ir::Op> kept;
      for (ir::Op& op : b.ops) {
        bool dead = removable_if_unused(op) && op.regions.empty() && !op.results.empty() &&
                    std::all_of(op.results.begin(), op.results.end(), [&](ir::ValueId r) { return uses[r] == 0; });
        if (dead) {
          ++removed;
          changed = true;
          continue;
        }
        for (ir::Block& r : op.regions) sweep(r);
        kept.push_back(std::move(op));
      }
      b.ops = std::move(kept);
    };
    sweep(f.body);
  }
  return removed;
}

}  // namespace

CanonicalizeStats canonicalize(ir::Function& f) {
  CanonicalizeStats s;
  s.cse_removed = Cse(f).run();
  s.dce_removed = dce(f);
  return s;
}

}  // namespace tilejit::jit
