// Names and the text form of the per-thread IR (printed by --dump-after=lower).
#include "jit/thread_ir.hpp"

#include <fmt/format.h>

#include <array>

namespace tilejit::jit::pir {
namespace {

constexpr std::array<const char*, static_cast<size_t>(Op::yield) + 1> kNames{
    "constant", "param", "thread_id", "block_id", "grid_dim",
    "add", "sub", "mul", "div", "rem", "minimum", "maximum", "and", "or", "xor", "shl", "shr", "umulhi", "byte_perm", "fma",
    "neg", "not", "abs", "popc",
    "exp2", "log2", "exp", "log", "sqrt", "rsqrt", "rcp", "floor", "ceil", "tanh", "sin", "cos", "erf",
    "cmp", "select", "cast", "bitcast", "opaque", "keep_alive", "pack2", "unpack2", "load_vec", "store_vec", "gep", "load", "store", "atomic_add", "atomic_rmw", "atomic_cas", "sem_wait", "sem_signal", "load_shared",
    "store_shared", "barrier", "named_barrier_sync", "named_barrier_arrive", "set_max_registers", "exit_thread", "shfl_xor", "ballot", "mma_16816",
    "cvt_tf32", "mma_1688_tf32",
    "smem_addr", "mbar_init", "mbar_expect_tx", "mbar_arrive", "mbar_wait", "mbar_inval", "atom_shared", "tma_load_2d", "fence_mbar_init",
    "fence_proxy_async", "wgmma_fence", "wgmma_commit", "wgmma_wait", "wgmma", "wgmma_rs", "tma_load",
    "tma_reduce_add", "tma_store", "bulk_commit", "bulk_wait", "fence_proxy_async_global", "read_clock", "for", "if", "yield"};

void print_block(const Func& f, const Block& b, int depth, std::string& out) {
  for (const Inst& in : b.insts) {
    out.append(static_cast<size_t>(depth) * 2, ' ');
    std::vector<std::string> rs, as;
    for (V r : in.results) rs.push_back(fmt::format("%{}:{}", r, type_name(f.types[r])));
    for (V a : in.args) as.push_back(fmt::format("%{}", a));
    if (!rs.empty()) out += fmt::format("{} = ", fmt::join(rs, ", "));
    out += op_name(in.op);
    if (in.op == Op::constant) {
      out += ir::is_float(f.types[in.results[0]].dtype) ? fmt::format(" {}", in.fimm) : fmt::format(" {}", in.imm);
    } else if (in.op == Op::param || in.op == Op::block_id || in.op == Op::grid_dim || in.op == Op::cmp ||
               in.op == Op::shfl_xor) {
      out += fmt::format(" #{}", in.imm);
    }
    if (!as.empty()) out += " " + fmt::format("{}", fmt::join(as, ", "));
    out += "\n";
    for (size_t i = 0; i < in.regions.size(); ++i) {
      const Block& r = in.regions[i];
      std::vector<std::string> args;
      for (V a : r.args) args.push_back(fmt::format("%{}:{}", a, type_name(f.types[a])));
      out.append(static_cast<size_t>(depth) * 2, ' ');
      out += fmt::format("{{ region {} ({})\n", i, fmt::join(args, ", "));
      print_block(f, r, depth + 1, out);
      out.append(static_cast<size_t>(depth) * 2, ' ');
      out += "}\n";
    }
  }
}

}  // namespace

std::string op_name(Op op) { return kNames.at(static_cast<size_t>(op)); }

std::string type_name(Ty t) {
  return t.ptr ? fmt::format("ptr<{}>", ir::name(t.dtype)) : std::string(ir::name(t.dtype));
}

std::string print(const Func& f) {
  std::vector<std::string> ps;
  for (const Param& p : f.params) ps.push_back(fmt::format("{}: {}", p.name, type_name(p.ty)));
  std::string out = fmt::format("thread_func @{}({}) threads={} smem={} {{\n", f.name, fmt::join(ps, ", "), f.num_threads,
                                f.smem_bytes);
  print_block(f, f.body, 1, out);
  out += "}\n";
  return out;
}

}  // namespace tilejit::jit::pir
