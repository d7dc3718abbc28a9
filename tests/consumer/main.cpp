// Builds and interprets a kernel through the installed headers and library only.
#include <cstdio>
#include <tilejit/tilejit.hpp>

using namespace tilejit::lang;

int main() {
  auto fn = kernel("scale", [](Builder& k) {
              auto X = k.pointer("X", f32);
              auto offs = arange(0, 64);
              store(X + offs, load(X + offs) * 3.0f);
            }).build();
  tilejit::runtime::HostTensor x(f32, {64});
  x.fill_uniform(5, -1, 1);
  auto before = x.to_f64();
  tilejit::runtime::interpret(fn, {1}, {x});
  for (int i = 0; i < 64; ++i)
    if (x.get_flat(i) != static_cast<double>(static_cast<float>(before[static_cast<size_t>(i)] * 3.0))) return 1;
  std::printf("consumer: tilejit %s found and working\n", TILEJIT_VERSION);
  return 0;
}
