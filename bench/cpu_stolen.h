// The share of the machine's CPU time its hypervisor gave to other guests ("steal" in
// /proc/stat): on a shared virtual machine a run can lose a third of its CPU to the host
// (20-50% seen during a batch-32 decode, bench/RESULTS.md, 2026-12-07, eleventh session), which
// slows it as a slower machine would. Every bench that times something prints it beside its
// figure, so that a slow run is told apart from a slow build.
#pragma once

#include <array>
#include <fstream>
#include <numeric>
#include <string>

namespace fpa::bench {

class CpuStolen {
 public:
  CpuStolen() : start_(read()) {}
  // The share of the machine's CPU time stolen since construction, or -1 where /proc/stat has
  // no steal column (not Linux, or a kernel before 2.6.11).
  double fraction() const {
    const Ticks now = read();
    const double total = now.total - start_.total;
    if (start_.stolen < 0 || now.stolen < 0 || total <= 0) return -1.0;
    return (now.stolen - start_.stolen) / total;
  }

 private:
  struct Ticks {
    double stolen = -1.0, total = 0.0;
  };
  // The first line of /proc/stat: cpu user nice system idle iowait irq softirq steal ...
  static Ticks read() {
    std::ifstream stat("/proc/stat");
    std::string cpu;
    std::array<double, 8> t{};
    if (!(stat >> cpu) || cpu != "cpu") return {};
    for (double& x : t) {
      if (!(stat >> x)) return {};
    }
    return {t[7], std::accumulate(t.begin(), t.end(), 0.0)};
  }
  Ticks start_;
};

}  // namespace fpa::bench
