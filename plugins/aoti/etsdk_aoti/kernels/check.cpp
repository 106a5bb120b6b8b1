// etsdk-aoti kernels: a standalone check of one level's table against reference outputs, without torch.
//
//   check DIR     reads DIR/cases.txt and the raw arrays beside it, runs every case through etsdk_kernels_table()
//                 (this program is linked with one level's sources), compares with the expected outputs, prints one
//                 line per case and a summary last; exit status 1 when a case failed.
//
// The cases and their expected outputs are written by plugins/aoti/tests/test_kernel_check.py from the same torch
// references the Python kernel tests use; this is how the aarch64 levels are tested under qemu-aarch64 on an x86
// host (and the portable level natively, which checks this program itself). One case per line of cases.txt:
//
//   qmm NAME bits group n k m mins bias                  NAME.{x,q,scales[,mins][,bias],want}
//   a8 NAME bits parts group k m halves mins bias n0 ... NAME.{x,want}, NAME.p.{q,scales[,mins][,bias]} per part p
//   linear NAME dtype n k m bias                         NAME.{x,w[,bias],want}   (dtype 0 f32, 1 bf16, 2 f16)
//   attention NAME int8 B Hq L E H S Ev MB scale          NAME.{q,k,v,mask,want[,kscale,vscale]}
//
// Arrays are little-endian, C order: float32, int8 / uint8 weights, uint16 for 16-bit values, one byte per bool.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "table.h"

namespace {

using namespace etsdk_kernels;

std::string dir;

template <typename T>
std::vector<T> read(const std::string& name, size_t count) {
  std::ifstream in(dir + "/" + name, std::ios::binary);
  std::vector<T> out(count);
  if (!in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(count * sizeof(T)))) {
    throw std::runtime_error("cannot read " + std::to_string(count * sizeof(T)) + " bytes of " + name);
  }
  return out;
}

// Largest |got - want| / (atol + rtol |want|); a case passes when it is at most 1.
double worst(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol) {
  double bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs((double)got[i] - want[i]) / (atol + rtol * std::fabs((double)want[i]));
    if (!(e <= bad)) bad = std::isnan(e) ? INFINITY : e;
  }
  return bad;
}

double run(const std::string& op, std::istringstream& line, const KernelTable* table, std::string& name) {
  line >> name;
  if (op == "qmm") {
    int64_t bits, group, n, k, m, mins, bias;
    line >> bits >> group >> n >> k >> m >> mins >> bias;
    const int64_t groups = group ? k / group : 1;
    Weights w{};
    w.bits = (int)bits, w.n = n, w.k = k, w.group = group, w.groups = groups;
    auto x = read<float>(name + ".x", m * k);
    auto q = read<uint8_t>(name + ".q", bits == 8 ? n * k : n * k / 2);
    auto s = read<float>(name + ".scales", n * groups);
    std::vector<float> mn = mins ? read<float>(name + ".mins", n * groups) : std::vector<float>();
    std::vector<float> b = bias ? read<float>(name + ".bias", n) : std::vector<float>();
    w.q8 = reinterpret_cast<const int8_t*>(q.data()), w.q4 = q.data(), w.scales = s.data();
    w.mins = mins ? mn.data() : nullptr, w.bias = bias ? b.data() : nullptr;
    std::vector<float> y(m * n);
    table->qmm(&w, x.data(), m, y.data());
    return worst(y, read<float>(name + ".want", m * n), 1e-4, 1e-4);
  }
  if (op == "a8") {
    int64_t bits, parts, group, k, m, halves, mins, bias;
    line >> bits >> parts >> group >> k >> m >> halves >> mins >> bias;
    std::vector<int64_t> ns(parts);
    int64_t total = 0;
    for (auto& n : ns) line >> n, total += n;
    const int64_t groups = group ? k / group : 1;
    auto x = read<float>(name + ".x", m * k);
    std::vector<float> y(m * total);
    std::vector<std::vector<uint8_t>> q(parts);
    std::vector<std::vector<int8_t>> q8(parts);
    std::vector<std::vector<float>> s(parts), mn(parts), b(parts);
    std::vector<std::vector<uint16_t>> s16(parts), m16(parts);
    std::vector<A8Part> list(parts);
    for (int64_t p = 0, column = 0; p < parts; column += ns[p], ++p) {
      const std::string prefix = name + "." + std::to_string(p);
      const int64_t n = ns[p];
      A8Part& part = list[p];
      part.w = Weights{};
      part.w.bits = (int)bits, part.w.n = n, part.w.k = k, part.w.group = group, part.w.groups = groups;
      if (bits == 8) {
        q8[p] = read<int8_t>(prefix + ".q", n * k);
        part.w.q8 = q8[p].data();
      } else {
        q[p] = read<uint8_t>(prefix + ".q", n * k / 2);
        part.w.q4 = q[p].data();
      }
      if (halves) {
        s16[p] = read<uint16_t>(prefix + ".scales", n * groups);
        part.s16 = s16[p].data();
        if (mins) m16[p] = read<uint16_t>(prefix + ".mins", n * groups), part.m16 = m16[p].data();
      } else {
        s[p] = read<float>(prefix + ".scales", n * groups);
        part.w.scales = s[p].data();
        if (mins) mn[p] = read<float>(prefix + ".mins", n * groups), part.w.mins = mn[p].data();
      }
      if (bias) b[p] = read<float>(prefix + ".bias", n), part.w.bias = b[p].data();
      part.y = y.data() + column;
    }
    table->qmm_a8(list.data(), parts, x.data(), m, total);
    return worst(y, read<float>(name + ".want", m * total), 1e-3, 1e-4);
  }
  if (op == "linear") {
    int64_t dtype, n, k, m, bias;
    line >> dtype >> n >> k >> m >> bias;
    auto x = read<float>(name + ".x", m * k);
    std::vector<float> w32;
    std::vector<uint16_t> w16;
    const void* w = nullptr;
    if (dtype == 0) w32 = read<float>(name + ".w", n * k), w = w32.data();
    else w16 = read<uint16_t>(name + ".w", n * k), w = w16.data();
    std::vector<float> b = bias ? read<float>(name + ".bias", n) : std::vector<float>();
    std::vector<float> y(m * n);
    table->linear(x.data(), w, static_cast<FloatWeight>(dtype), bias ? b.data() : nullptr, y.data(), m, n, k);
    return worst(y, read<float>(name + ".want", m * n), 1e-4, 1e-4);
  }
  if (op == "attention") {
    int64_t int8, B, Hq, L, E, H, S, Ev, MB;
    float scale;
    line >> int8 >> B >> Hq >> L >> E >> H >> S >> Ev >> MB >> scale;
    auto q = read<float>(name + ".q", B * Hq * L * E);
    auto mask = read<uint8_t>(name + ".mask", MB * L * S);
    std::vector<float> k32, v32, ks, vs;
    std::vector<int8_t> k8, v8;
    const void *k = nullptr, *v = nullptr;
    if (int8) {
      k8 = read<int8_t>(name + ".k", B * H * S * E), v8 = read<int8_t>(name + ".v", B * H * S * Ev);
      ks = read<float>(name + ".kscale", B * H * S), vs = read<float>(name + ".vscale", B * H * S);
      k = k8.data(), v = v8.data();
    } else {
      k32 = read<float>(name + ".k", B * H * S * E), v32 = read<float>(name + ".v", B * H * S * Ev);
      k = k32.data(), v = v32.data();
    }
    std::vector<float> out(B * Hq * L * Ev);
    int64_t attended = 0;
    std::vector<etsdk_kernels::CacheRows> caches(B);  // batch b's rows within the one buffer
    const int64_t width = int8 ? 1 : 4;
    for (int64_t b = 0; b < B; ++b)
      caches[b] = {static_cast<const char*>(k) + b * H * S * E * width, int8 ? ks.data() + b * H * S : nullptr,
                   static_cast<const char*>(v) + b * H * S * Ev * width, int8 ? vs.data() + b * H * S : nullptr};
    table->attention(q.data(), caches.data(), reinterpret_cast<const bool*>(mask.data()), out.data(), B, Hq, L, E, H, S,
                     Ev, MB, scale, &attended);
    return worst(out, read<float>(name + ".want", B * Hq * L * Ev), 1e-5, 1e-4);
  }
  throw std::runtime_error("unknown operation " + op);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: check DIR (DIR/cases.txt and the arrays it names)\n";
    return 2;
  }
  dir = argv[1];
  const KernelTable* table = etsdk_kernels_table();
  std::ifstream cases(dir + "/cases.txt");
  if (!cases) {
    std::cerr << "cannot read " << dir << "/cases.txt\n";
    return 2;
  }
  std::cout << "level " << table->level << "\n";
  int passed = 0, failed = 0;
  for (std::string text; std::getline(cases, text);) {
    if (text.empty()) continue;
    std::istringstream line(text);
    std::string op, name;
    line >> op;
    try {
      const double error = run(op, line, table, name);
      const bool ok = error <= 1.0;
      (ok ? passed : failed) += 1;
      std::cout << (ok ? "ok " : "FAIL ") << op << " " << name << " error " << error << "\n";
    } catch (const std::exception& exc) {
      failed += 1;
      std::cout << "FAIL " << op << " " << name << ": " << exc.what() << "\n";
    }
  }
  std::cout << "cases: " << passed << " match, " << failed << " do not\n";
  return failed ? 1 : 0;
}
