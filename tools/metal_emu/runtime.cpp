// The emulator's runner (see include/runtime.h). One Group holds the state of the
// threadgroup being run; a GPU thread that must wait (barrier, simd collective) blocks on
// a predicate over that state. A deadlock (every unfinished thread blocked, none able to
// go on) is how a barrier reached by only part of the threadgroup shows up.
#include "runtime.h"

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif

namespace emu {
namespace {

struct Abort {};

struct SimdState {
  unsigned lanes = 0;
  unsigned arrived[2] = {0, 0};
  uint64_t gen[2] = {0, 0};
  const void* site[2] = {nullptr, nullptr};
  uint64_t data[2][kSimdWidth] = {};
  float mma_in[2][kSimdWidth][6] = {};
  float mma_out[2][64] = {};
  std::vector<const void*> log;  // call site of each simd op since the last collective
  uint64_t log_base = 0;
};

struct Group;

struct Ctx {
  ThreadIds ids{};
  Group* g = nullptr;
  uint64_t collectives = 0;  // simd collectives this lane has entered
  uint64_t simd_ops = 0;     // all simd ops this lane has entered
  std::function<bool()> pred;
  bool blocked = false, finished = false;
  const char* waiting_on = "";
  ucontext_t uc{};  // only to enter the fiber the first time
  jmp_buf jb;
  bool started = false;
  char* stack = nullptr;
  void* fake_stack = nullptr;
};

constexpr size_t kFiberStack = 64 * 1024;

struct Group {
  Dispatch d{};
  unsigned n = 0;
  std::vector<Ctx> ctx;
  std::vector<SimdState> simd;
  unsigned bar_arrived = 0;
  uint64_t bar_gen = 0;
  const void* bar_site = nullptr;
  unsigned finished = 0, blocked = 0;
  std::string error;
  bool aborted = false;
  void* tg_mem = nullptr;
  void* const* buffers = nullptr;
  Trampoline fn = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  jmp_buf sched;
  void* sched_fake_stack = nullptr;
  const void* sched_stack_bottom = nullptr;
  size_t sched_stack_size = 0;
};

thread_local Ctx* tl_cur = nullptr;

// In real-thread mode every entry into the runner holds the group's mutex.
struct Guard {
  std::unique_lock<std::mutex> lk;
  explicit Guard(Group& g) : lk(g.mu, std::defer_lock) {
    if (g.d.real_threads) lk.lock();
  }
};

std::string where(const Group& g) {
  std::ostringstream s;
  s << "threadgroup (" << g.ctx[0].ids.group[0] << "," << g.ctx[0].ids.group[1] << ","
    << g.ctx[0].ids.group[2] << "): ";
  return s.str();
}

void set_error(Group& g, const std::string& msg) {
  if (g.error.empty()) g.error = where(g) + msg;
  g.aborted = true;
  if (g.d.real_threads) g.cv.notify_all();
}

[[noreturn]] void fail(Group& g, const std::string& msg) {
  set_error(g, msg);
  throw Abort();
}

// Every unfinished thread blocked and none of them able to continue.
bool deadlocked(Group& g, std::string* msg) {
  if (g.blocked == 0 || g.blocked + g.finished != g.n) return false;
  std::map<std::string, unsigned> at;
  for (auto& c : g.ctx) {
    if (!c.blocked) continue;
    if (c.pred()) return false;
    at[c.waiting_on]++;
  }
  std::ostringstream s;
  s << "deadlock: ";
  for (auto& kv : at) s << kv.second << " threads wait at " << kv.first << ", ";
  s << g.finished << " of " << g.n << " finished (a barrier or simd call reached by only part of"
    << " its threadgroup / simdgroup)";
  *msg = s.str();
  return true;
}

// Switching with _setjmp/_longjmp (no signal-mask system call, unlike swapcontext);
// makecontext/swapcontext only enter a fresh fiber. The sanitizer calls tell
// AddressSanitizer which stack is live.
void start_switch(void** fake_save, const void* bottom, size_t size) {
#ifdef EMU_ASAN
  __sanitizer_start_switch_fiber(fake_save, bottom, size);
#else
  (void)fake_save, (void)bottom, (void)size;
#endif
}

void after_switch(void* fake, const void** bottom_old, size_t* size_old) {
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, bottom_old, size_old);
#else
  (void)fake, (void)bottom_old, (void)size_old;
#endif
}

// fiber -> scheduler
void yield_fiber(Ctx& c) {
  Group& g = *c.g;
  if (_setjmp(c.jb) == 0) {
    start_switch(&c.fake_stack, g.sched_stack_bottom, g.sched_stack_size);
    _longjmp(g.sched, 1);
  }
  after_switch(c.fake_stack, nullptr, nullptr);
}

// scheduler -> fiber, back when it yields or finishes
void resume_fiber(Group& g, Ctx& c) {
  if (_setjmp(g.sched) == 0) {
    start_switch(&g.sched_fake_stack, c.stack, kFiberStack);
    if (!c.started) {
      c.started = true;
      ucontext_t here;
      swapcontext(&here, &c.uc);  // never resumed: the fiber comes back by _longjmp
    }
    _longjmp(c.jb, 1);
  }
  after_switch(g.sched_fake_stack, nullptr, nullptr);
}

void wait_until(Ctx& c, Guard& guard, const std::function<bool()>& pred, const char* what) {
  Group& g = *c.g;
  if (g.aborted) throw Abort();
  if (pred()) return;
  c.blocked = true;
  c.pred = pred;
  c.waiting_on = what;
  g.blocked++;
  std::string msg;
  if (deadlocked(g, &msg)) {
    g.blocked--;
    c.blocked = false;
    fail(g, msg);
  }
  if (g.d.real_threads) {
    g.cv.wait(guard.lk, [&] { return g.aborted || pred(); });
  } else {
    while (!g.aborted && !pred()) yield_fiber(c);
  }
  g.blocked--;
  c.blocked = false;
  c.pred = nullptr;
  if (g.aborted) throw Abort();
}

void notify(Group& g) {
  if (g.d.real_threads) g.cv.notify_all();
}

// Records the call site of this lane's next simd op; lanes must agree op by op.
void log_simd_op(Ctx& c, SimdState& s, const void* site) {
  const uint64_t idx = c.simd_ops++ - s.log_base;
  if (idx == s.log.size()) {
    s.log.push_back(site);
  } else if (idx > s.log.size() || s.log[idx] != site) {
    fail(*c.g, "simd call in divergent code: lanes of simdgroup " +
                   std::to_string(c.ids.simdgroup) + " reach different simd calls");
  }
}

// Lanes arrive, deposit, wait for all; `complete` runs once, in the last lane to arrive.
template <class Deposit, class Complete>
int simd_collective(const void* site, const char* what, Deposit&& deposit, Complete&& complete) {
  Ctx& c = *tl_cur;
  Group& g = *c.g;
  Guard guard(g);
  if (g.aborted) throw Abort();
  SimdState& s = g.simd[c.ids.simdgroup];
  log_simd_op(c, s, site);
  const int slot = int(c.collectives++ & 1);
  if (s.arrived[slot] == 0) {
    s.site[slot] = site;
  } else if (s.site[slot] != site) {
    fail(g, std::string("simd call in divergent code: lanes wait at different ") + what);
  }
  deposit(s, slot);
  const uint64_t gen = s.gen[slot];
  if (++s.arrived[slot] == s.lanes) {
    s.arrived[slot] = 0;
    complete(s, slot);
    s.log.clear();
    s.log_base = c.simd_ops;
    s.gen[slot]++;
    notify(g);
  }
  wait_until(c, guard, [&s, slot, gen] { return s.gen[slot] != gen; }, what);
  return slot;
}

void fiber_finish(Ctx& c) {
  Group& g = *c.g;
  c.finished = true;
  g.finished++;
  std::string msg;
  if (deadlocked(g, &msg)) set_error(g, msg);
}

void fiber_entry(unsigned lo, unsigned hi) {
  Ctx& c = *reinterpret_cast<Ctx*>((uintptr_t(hi) << 32) | uintptr_t(lo));
  Group& g = *c.g;
  after_switch(nullptr, &g.sched_stack_bottom, &g.sched_stack_size);
  try {
    g.fn(g.buffers);
  } catch (const Abort&) {
  }
  fiber_finish(c);
  start_switch(nullptr, g.sched_stack_bottom, g.sched_stack_size);  // this fiber is done
  _longjmp(g.sched, 1);
}

void run_fibers(Group& g) {
  for (auto& c : g.ctx) {
    c.stack = static_cast<char*>(std::malloc(kFiberStack));
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = c.stack;
    c.uc.uc_stack.ss_size = kFiberStack;
    c.uc.uc_link = nullptr;
    const uintptr_t p = reinterpret_cast<uintptr_t>(&c);
    makecontext(&c.uc, reinterpret_cast<void (*)()>(fiber_entry), 2, unsigned(p & 0xffffffffu),
                unsigned(p >> 32));
  }
  std::vector<unsigned> order(g.n);
  for (unsigned i = 0; i < g.n; ++i) order[i] = g.d.order == kReverse ? g.n - 1 - i : i;
  std::mt19937_64 rng(g.d.seed ^ (uint64_t(g.ctx[0].ids.group[0]) * 0x9e3779b97f4a7c15ull) ^
                      (uint64_t(g.ctx[0].ids.group[1]) << 40));
  std::bernoulli_distribution run_now(0.5);
  while (g.finished < g.n) {
    // kRandom: a shuffled half of the threads per pass, so some run several scheduling
    // points ahead of others (exposes reliance on lanes running in lockstep)
    if (g.d.order == kRandom) std::shuffle(order.begin(), order.end(), rng);
    for (unsigned i : order) {
      Ctx& c = g.ctx[i];
      if (c.finished) continue;
      if (c.blocked && !g.aborted && !c.pred()) continue;  // would only yield again
      if (g.d.order == kRandom && !run_now(rng)) continue;
      tl_cur = &c;
      resume_fiber(g, c);
      tl_cur = nullptr;
    }
  }
  for (auto& c : g.ctx) std::free(c.stack);
}

void run_threads(Group& g) {
  std::vector<std::thread> ts;
  ts.reserve(g.n);
  for (auto& c : g.ctx) {
    ts.emplace_back([&g, &c] {
      tl_cur = &c;
      try {
        g.fn(g.buffers);
      } catch (const Abort&) {
      }
      Guard guard(g);
      fiber_finish(c);
      g.cv.notify_all();
    });
  }
  for (auto& t : ts) t.join();
}

std::map<std::string, Trampoline>& registry() {
  static std::map<std::string, Trampoline> r;
  return r;
}

}  // namespace

ThreadIds& current() { return tl_cur->ids; }

void threadgroup_rendezvous(const void* site) {
  Ctx& c = *tl_cur;
  Group& g = *c.g;
  Guard guard(g);
  if (g.aborted) throw Abort();
  if (g.bar_arrived == 0) {
    g.bar_site = site;
  } else if (g.bar_site != site) {
    fail(g, "threads of one threadgroup wait at different threadgroup_barrier calls");
  }
  const uint64_t gen = g.bar_gen;
  if (++g.bar_arrived == g.n) {
    g.bar_arrived = 0;
    g.bar_gen++;
    notify(g);
  }
  wait_until(c, guard, [&g, gen] { return g.bar_gen != gen; }, "threadgroup_barrier");
}

const uint64_t* simd_rendezvous(const void* site, uint64_t value, const void*) {
  const int slot = simd_collective(
      site, "simd_shuffle / simdgroup_barrier",
      [&](SimdState& s, int sl) { s.data[sl][tl_cur->ids.lane] = value; },
      [](SimdState&, int) {});
  return tl_cur->g->simd[tl_cur->ids.simdgroup].data[slot];
}

const float* simd_mma_rendezvous(const void* site, const float mine[6]) {
  const int slot = simd_collective(
      site, "simdgroup_multiply_accumulate",
      [&](SimdState& s, int sl) { std::memcpy(s.mma_in[sl][tl_cur->ids.lane], mine, 6 * sizeof(float)); },
      [](SimdState& s, int sl) {
        float a[64], b[64], c[64];
        for (unsigned l = 0; l < kSimdWidth; ++l)
          for (int u = 0; u < 2; ++u) {
            a[2 * l + u] = s.mma_in[sl][l][u];
            b[2 * l + u] = s.mma_in[sl][l][2 + u];
            c[2 * l + u] = s.mma_in[sl][l][4 + u];
          }
        for (int i = 0; i < 8; ++i)
          for (int j = 0; j < 8; ++j) {
            float acc = c[i * 8 + j];
            for (int k = 0; k < 8; ++k) acc += a[i * 8 + k] * b[k * 8 + j];
            s.mma_out[sl][i * 8 + j] = acc;
          }
      });
  return tl_cur->g->simd[tl_cur->ids.simdgroup].mma_out[slot];
}

void simd_step(const void* site) {
  Ctx& c = *tl_cur;
  Group& g = *c.g;
  {
    Guard guard(g);
    if (g.aborted) throw Abort();
    log_simd_op(c, g.simd[c.ids.simdgroup], site);
  }
  if (!g.d.real_threads) yield_fiber(c);
}

void* buffer(void* const* buffers, int index) {
  Group& g = *tl_cur->g;
  if (index < 0 || index >= g.d.num_buffers || buffers[index] == nullptr) {
    Guard guard(g);
    fail(g, "buffer(" + std::to_string(index) + ") is not bound");
  }
  return buffers[index];
}

void* threadgroup_memory(int index) {
  Group& g = *tl_cur->g;
  if (index != 0) {
    Guard guard(g);
    fail(g, "only threadgroup(0) is emulated");
  }
  return g.tg_mem;
}

bool register_kernel(const char* host_name, Trampoline fn) {
  registry()[host_name] = fn;
  return true;
}

std::string dispatch(const char* host_name, void* const* buffers, const Dispatch& d) {
  auto it = registry().find(host_name);
  if (it == registry().end()) return std::string("no kernel named ") + host_name;
  if (d.threads == 0 || d.threads % kSimdWidth != 0) return "threads per threadgroup must be a multiple of 32";
  for (unsigned z = 0; z < d.groups[2]; ++z)
    for (unsigned y = 0; y < d.groups[1]; ++y)
      for (unsigned x = 0; x < d.groups[0]; ++x) {
        Group g;
        g.d = d;
        g.n = d.threads;
        g.fn = it->second;
        g.buffers = buffers;
        // exact size, so AddressSanitizer sees any access past the end
        g.tg_mem = std::malloc(d.threadgroup_bytes);
        for (size_t b = 0; b < d.threadgroup_bytes; ++b)
          static_cast<unsigned char*>(g.tg_mem)[b] = uint8_t(d.poison >> (8 * (b % 4)));
        g.ctx.resize(g.n);
        g.simd.resize(g.n / kSimdWidth);
        for (auto& s : g.simd) s.lanes = kSimdWidth;
        for (unsigned t = 0; t < g.n; ++t) {
          Ctx& c = g.ctx[t];
          c.g = &g;
          c.ids = {t, t % kSimdWidth, t / kSimdWidth, {x, y, z}, g.n};
        }
        if (d.real_threads)
          run_threads(g);
        else
          run_fibers(g);
        std::free(g.tg_mem);
        if (!g.error.empty()) return g.error;
      }
  return "";
}

}  // namespace emu
