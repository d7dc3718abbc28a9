// The smallest tilejit program: out = x + y over a 1-D array, one program per BLOCK elements,
// run in the CPU interpreter and checked against a plain C++ loop.
#include <cstdio>
#include <cstring>
#include <tilejit/tilejit.hpp>

#include "compile_check.hpp"
#include "runtime/run.hpp"

using namespace tilejit::lang;
using tilejit::runtime::Arg;
using tilejit::runtime::HostTensor;

int main(int argc, char** argv) {
  Kernel vector_add = kernel("vector_add", [](Builder& k) {
    auto X = k.pointer("X", f32, {.align_bytes = 16});
    auto Y = k.pointer("Y", f32, {.align_bytes = 16});
    auto Out = k.pointer("Out", f32, {.align_bytes = 16});
    auto n = k.scalar<int>("n");
    auto BLOCK = k.meta<int>("BLOCK", 256);

    auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
    auto mask = offs < n;  // the last program is ragged
    store(Out + offs, load(X + offs, mask) + load(Y + offs, mask), mask);
  });

  auto fn = vector_add.build({{"BLOCK", 128}});
  if (argc > 1 && std::strcmp(argv[1], "--compile") == 0) return compile_both_backends(fn);
  if (argc > 1 && std::strcmp(argv[1], "--ir") == 0) {
    std::fputs(tilejit::ir::print(fn).c_str(), stdout);
    return 0;
  }

  const int n = 1000;  // not a multiple of BLOCK
  HostTensor x(f32, {n}), y(f32, {n}), out(f32, {n});
  x.fill_uniform(1, -1, 1);
  y.fill_uniform(2, -1, 1);
  auto report = tilejit::runtime::run(fn, {cdiv(n, 128)}, {x, y, out, n});

  std::vector<double> ref(n);
  for (int i = 0; i < n; ++i) ref[static_cast<size_t>(i)] = x.get_flat(i) + y.get_flat(i);
  double err = tilejit::runtime::rel_error(out.to_f64(), ref);
  std::printf("vector_add (%s): n=%d, relative error vs reference = %.3g\n",
              report.where == tilejit::runtime::Where::Gpu ? "GPU" : "CPU interpreter", n, err);
  return err < 1e-6 ? 0 : 1;
}
