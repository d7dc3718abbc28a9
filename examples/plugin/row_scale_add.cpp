// A user's kernel in a plugin: Out = X + Alpha[row] * Y over a matrix, with its default schedule
// and a tuning space, registered for the `tilejit` tool (README "Your kernels in the tools"):
//
//   tilejit --plugin ./librow_scale_add.so compile row_scale_add --emit ptx -o out/
//
// Built against an installed tilejit by this folder's CMakeLists.txt, and in-tree by the tests.
#include <tilejit/tilejit.hpp>

#include <algorithm>
#include <stdexcept>

#include "api/plugin.hpp"

using namespace tilejit::lang;
namespace rt = tilejit::runtime;

namespace {

// Parameters X, Y, Alpha, Out; grid (cdiv(rows, BLOCK_R), cdiv(cols, BLOCK_C)). Alpha is f32, the
// matrices DTYPE; the arithmetic is f32.
const Kernel& row_scale_add() {
  static const Kernel k = kernel("row_scale_add", [](Builder& b) {
    const DType T = b.meta_dtype("DTYPE", f32);
    const int BR = b.meta<int>("BLOCK_R", 16);
    const int BC = b.meta<int>("BLOCK_C", 128);
    auto X = b.tensor("X", T, 2, {.contiguous_last = true});
    auto Y = b.tensor("Y", T, 2, {.contiguous_last = true});
    auto Alpha = b.tensor("Alpha", f32, 1);
    auto Out = b.tensor("Out", T, 2, {.contiguous_last = true});

    auto r0 = program_id(0) * BR;
    auto c0 = program_id(1) * BC;
    auto x = cast(f32, load(X.block({r0, c0}, {BR, BC})));
    auto y = cast(f32, load(Y.block({r0, c0}, {BR, BC})));
    auto alpha = load(Alpha.block({r0}, {BR}));
    store(Out.block({r0, c0}, {BR, BC}), cast(T, x + alpha[col] * y));
  });
  return k;
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

DType fixed_dtype(const rt::TuningContext& ctx) {
  for (const auto& [name, value] : ctx.fixed)
    if (name == "DTYPE")
      if (const DType* d = std::get_if<DType>(&value)) return *d;
  return f32;
}

// Dimension `dim` of X, the first argument: the tuning key of a call.
int64_t x_size(std::span<const rt::DeviceArg> args, int dim) {
  if (args.empty() || !args[0].tensor() || args[0].tensor()->rank() != 2)
    throw std::invalid_argument("row_scale_add: argument 0 (X) must be a matrix");
  return args[0].tensor()->sizes[static_cast<size_t>(dim)];
}

// What `tilejit tune row_scale_add --shape R,C` searches: tiles and warps, keyed by the matrix's
// rows and columns rounded up to powers of two.
rt::TuningSpace make_space() {
  rt::TuningSpace s("row_scale_add", &row_scale_add);
  s.param("BLOCK_R", {8, 16, 32})
      .param("BLOCK_C", {64, 128, 256})
      .param("warps", {4, 8})
      .constrain("at most 32 elements of a tile per thread (no spills)",
                 [](const rt::TuningConfig& c, const rt::TuningContext&) {
                   return c.get("BLOCK_R") * c.get("BLOCK_C") / (32 * c.get("warps")) <= 32;
                 })
      .key("R", rt::Bucketing::pow2(16), [](std::span<const rt::DeviceArg> a, const Meta&) { return x_size(a, 0); })
      .key("C", rt::Bucketing::pow2(64), [](std::span<const rt::DeviceArg> a, const Meta&) { return x_size(a, 1); })
      .default_config({{{"BLOCK_R", 16}, {"BLOCK_C", 128}, {"warps", 4}}})
      .workload([](const rt::TuningConfig& c, const rt::TuningContext& ctx) {
        const int64_t R = rt::shape_get(ctx.shape, "R"), C = rt::shape_get(ctx.shape, "C");
        const double e = static_cast<double>(tilejit::ir::byte_size(fixed_dtype(ctx)));
        rt::Workload w;
        w.flops = 2.0 * static_cast<double>(R * C);
        w.dram_bytes = 3.0 * e * static_cast<double>(R * C) + 4.0 * static_cast<double>(R);
        w.l2_bytes = w.dram_bytes;
        w.programs = cdiv(R, c.get("BLOCK_R")) * cdiv(C, c.get("BLOCK_C"));
        w.threads = static_cast<int>(32 * c.get("warps"));
        w.est_registers = static_cast<int>(std::min<int64_t>(255, 3 * c.get("BLOCK_R") * c.get("BLOCK_C") / w.threads + 24));
        return w;
      })
      .problem([](const rt::TuningContext& ctx) {
        const int64_t R = rt::shape_get(ctx.shape, "R"), C = rt::shape_get(ctx.shape, "C");
        const DType t = fixed_dtype(ctx);
        rt::ProblemData d;
        d.tensors.push_back(std::make_unique<rt::HostTensor>(t, tilejit::ir::Shape{R, C}));
        d.tensors.push_back(std::make_unique<rt::HostTensor>(t, tilejit::ir::Shape{R, C}));
        d.tensors.push_back(std::make_unique<rt::HostTensor>(f32, tilejit::ir::Shape{R}));
        d.tensors.push_back(std::make_unique<rt::HostTensor>(t, tilejit::ir::Shape{R, C}));
        for (uint64_t i = 0; i < 3; ++i) d.tensors[i]->fill_uniform(i + 1, -1, 1);
        for (auto& x : d.tensors) d.args.emplace_back(*x);
        d.outputs = {3};
        d.tolerance = 1e-6;  // every config computes each element the same way
        return d;
      })
      .grid([](const rt::TuningConfig& c, const rt::TuningContext& ctx) {
        return rt::Grid{cdiv(rt::shape_get(ctx.shape, "R"), c.get("BLOCK_R")), cdiv(rt::shape_get(ctx.shape, "C"), c.get("BLOCK_C"))};
      });
  return s;
}

const rt::TuningSpace& row_scale_add_space() {
  static const rt::TuningSpace s = make_space();
  return s;
}

}  // namespace

TILEJIT_PLUGIN(registrar) {
  registrar.add({.name = "row_scale_add",
                 .kernel = &row_scale_add,
                 .summary = "Out = X + Alpha[row] * Y (a user kernel from examples/plugin)",
                 .default_meta = {{"BLOCK_R", 16}, {"BLOCK_C", 128}},
                 .num_warps = 4,
                 .stages = 1,
                 .tuning_space = &row_scale_add_space});
}
