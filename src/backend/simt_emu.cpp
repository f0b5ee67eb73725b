/* simt_emu.cpp - the SIMT emulator: runs a CUDA kernel launch on the CPU with CUDA's execution
 * semantics, so the kernels of src/ops/cuda/ can be tested on machines without a GPU (simt.h
 * is the kernel side, simt_emu.h the interface).
 *
 * A launch runs block by block on the calling thread. Inside a block every CUDA thread is a
 * fiber with its own stack. A sweep runs the runnable fibers in thread order, each until it
 * reaches a synchronisation point or returns; a fiber that stops hands over to the next runnable
 * one directly, and the last returns to the scheduler (the launching thread's stack), which
 * starts the next sweep. The last thread to arrive at a barrier or warp operation releases it:
 * it computes the result of every waiting thread (the shuffled value, the ballot, the barrier
 * count), marks them runnable and goes on without switching. A sweep that finds nothing
 * runnable while threads remain is a deadlock, reported with where every thread waits.
 *
 * Rules (sm_70+ semantics, checked strictly because this is a test tool):
 * - A block barrier releases when every thread of the block that has not exited has arrived.
 *   Threads waiting at two different __syncthreads call sites (or kinds) at once are an error:
 *   CUDA leaves that undefined, although sm_70+ hardware counts arrivals and would release them.
 * - A warp operation waits for every lane of its mask. A mask lane that has exited (CUDA allows
 *   that for __syncwarp but a shuffle would read garbage from it), a lane of the mask waiting at
 *   a different warp operation or with a different mask, and a mask without the calling lane
 *   are errors. Lanes past the end of a partial last warp do not exist: they are dropped from
 *   masks, and a shuffle reading from a lane outside the mask gets 0xFF bytes.
 * - Shuffles need no slot array that could be overwritten before everyone read it (the reason a
 *   slot array needs a second barrier): each lane keeps its value in its own fiber record and the
 *   releasing lane writes every lane's result into that lane's record at once. A lane replaces
 *   its value only when it reaches its next warp operation, after it has read its result.
 *
 * Fibers switch with a few lines of assembly on x86-64 and aarch64: push the callee-saved
 * registers, swap stack pointers, pop. swapcontext makes a sigprocmask system call per switch.
 * Measured on this project's 2-core x86-64 build machine: 10-14 ns per switch with the
 * assembly, 235 ns with swapcontext; the 4096 x 1024 row reduction of test_simt_emu took
 * 0.13 s against 1.7 s with 256 threads per block and 0.6 s against 8.9 s with 1024. Other
 * architectures, and builds with -DDT_SIMT_UCONTEXT, use ucontext.
 *
 * Stacks are mmap'ed once per fiber slot and reused by later launches, each with a PROT_NONE
 * guard of 64 KiB below it (larger than a page so that a frame with a big local array still
 * lands in it instead of in the neighbouring stack): an overflow is a SIGSEGV at the faulting
 * access. Under AddressSanitizer the switches are announced with
 * __sanitizer_{start,finish}_switch_fiber.
 */
#include "backend/simt_emu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <vector>

#if defined(DT_SIMT_UCONTEXT) || !(defined(__x86_64__) || defined(__aarch64__))
#define DT_SIMT_USE_UCONTEXT 1
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define DT_SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DT_SIMT_ASAN 1
#endif
#endif
#ifdef DT_SIMT_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

/* Valgrind must be told where the fiber stacks are, or every switch looks like a wild stack
 * access; the client requests cost a few instructions when not under valgrind. */
#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#include <valgrind/valgrind.h>
#define DT_SIMT_VALGRIND 1
#endif
#endif

/* ---------------------------------------------------------------------------------------------
 * Context switch. dt__simt_switch(save, next) pushes the callee-saved registers, stores the
 * stack pointer in *save, loads `next` and pops what was pushed there, returning into the other
 * fiber. The floating-point control registers (MXCSR, x87 control word, FPCR) are not switched:
 * kernels do not change them. */
#ifndef DT_SIMT_USE_UCONTEXT
extern "C" void dt__simt_switch(void** save, void* next);
#if defined(__x86_64__)
asm(".text\n"
    ".globl dt__simt_switch\n"
    ".hidden dt__simt_switch\n"
    ".type dt__simt_switch,@function\n"
    "dt__simt_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size dt__simt_switch,.-dt__simt_switch\n");
#else /* aarch64: x19-x30 and d8-d15, 160 bytes */
asm(".text\n"
    ".globl dt__simt_switch\n"
    ".hidden dt__simt_switch\n"
    ".type dt__simt_switch,%function\n"
    "dt__simt_switch:\n"
    "  sub sp, sp, #160\n"
    "  stp x19, x20, [sp, #0]\n"
    "  stp x21, x22, [sp, #16]\n"
    "  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n"
    "  stp x27, x28, [sp, #64]\n"
    "  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n"
    "  stp d10, d11, [sp, #112]\n"
    "  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x9, sp\n"
    "  str x9, [x0]\n"
    "  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n"
    "  ldp x21, x22, [sp, #16]\n"
    "  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n"
    "  ldp x27, x28, [sp, #64]\n"
    "  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n"
    "  ldp d10, d11, [sp, #112]\n"
    "  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #160\n"
    "  ret\n"
    ".size dt__simt_switch,.-dt__simt_switch\n");
#endif
#endif

namespace {

enum FiberState { RUNNABLE, WAITING, EXITED };

struct Fiber {
  dt_simt_uint3 tid; /* threadIdx, read by kernel code through dt_simt_thread_idx */
  FiberState state;
  int op;           /* the DT_SIMT_OP_* it waits at (or last reached) */
  unsigned mask;    /* warp operations: the mask, less the lanes that do not exist */
  int arg, width;   /* shuffles: source lane / delta / lane mask, segment width */
  uint64_t value;   /* its input: the predicate or the shuffled bytes */
  uint64_t result;  /* written by the thread that releases it */
  const char* file; /* the call site of that operation */
  const char* func;
  int line;
  unsigned char* stack; /* lowest usable byte; the guard lies below */
  unsigned char* top;   /* where the stack starts (see reserve_fibers) */
  void* sp;             /* saved stack pointer while switched out */
#ifdef DT_SIMT_USE_UCONTEXT
  ucontext_t uc;
#endif
#ifdef DT_SIMT_ASAN
  void* fake_stack;
#endif
};

/* The lanes of one warp waiting at one warp operation with one mask. A lane is in at most one
 * group, so a warp has at most 32; usually it has one. */
struct Group {
  int op;
  unsigned mask, arrived;
};

/* The state of the launch in progress; only touched with g_mutex held. */
struct Launch {
  const dt_simt_launch_desc_t* desc;
  dt_simt_uint3 block_idx;
  unsigned nthreads;
  unsigned char* dyn_smem;
  unsigned n_exited;      /* threads of the block that returned */
  unsigned n_bar;         /* threads waiting at the block barrier */
  unsigned bar_count;     /* how many of them passed a non-zero predicate */
  const Fiber* bar_first; /* the first of them (its op and site) */
  unsigned lanes[32];     /* per warp: the lanes that exist */
  unsigned exited[32];    /* per warp: the lanes that returned */
  unsigned n_groups[32];  /* per warp: the groups waiting at warp operations */
  Group groups[32][32];
  int error;
};

const size_t kGuardBytes = 64 * 1024;
const size_t kMaxDynSmem = 227 * 1024; /* an H100's / H200's per-block opt-in limit */

std::mutex g_mutex;
std::vector<Fiber> g_fibers; /* slots reused across launches; stacks are never unmapped */
size_t g_stack_bytes;
Launch g_launch;
Fiber* g_cur; /* the running fiber; NULL while the scheduler runs */
#ifdef DT_SIMT_USE_UCONTEXT
ucontext_t g_sched_uc;
#else
void* g_sched_sp; /* the scheduler's saved stack pointer */
#endif
#ifdef DT_SIMT_ASAN
void* g_sched_fake;
const void* g_sched_stack; /* the launching thread's stack, learnt from the first switch */
size_t g_sched_stack_size;
#endif
char g_msg[4096];
thread_local char t_last_error[4096];
thread_local int t_last_rc;
thread_local bool t_in_launch;

const char* const kOpNames[DT_SIMT_OP_COUNT] = {
    "__syncthreads",   "__syncthreads_count", "__syncthreads_and", "__syncthreads_or",
    "__syncwarp",      "__shfl_sync",         "__shfl_up_sync",    "__shfl_down_sync",
    "__shfl_xor_sync", "__ballot_sync",       "__any_sync",        "__all_sync"};

bool is_block_op(int op) { return op <= DT_SIMT_OP_SYNC_OR; }
unsigned index_of(const Fiber* f) { return (unsigned)(f - g_fibers.data()); }

/* ---------------------------------------------------------------------------------------------
 * Messages. The first error of a launch wins; later ones would only be its consequences. */

void append(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void append(const char* fmt, ...) {
  size_t len = strlen(g_msg);
  if (len + 1 >= sizeof g_msg) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_msg + len, sizeof g_msg - len, fmt, ap);
  va_end(ap);
}

/* Starts the message: "dt_simt: kernel 0x..., block (x,y,z), thread (x,y,z): ". */
void begin_error(int code, const Fiber* f) {
  if (g_launch.error) return;
  g_launch.error = code;
  g_msg[0] = '\0';
  append("dt_simt: kernel %p", g_launch.desc ? g_launch.desc->kernel : nullptr);
  if (g_launch.nthreads > 0) {
    const dt_simt_uint3& b = g_launch.block_idx;
    append(", block (%u,%u,%u)", b.x, b.y, b.z);
  }
  if (f != nullptr) append(", thread (%u,%u,%u)", f->tid.x, f->tid.y, f->tid.z);
  append(": ");
}

/* "__shfl_sync in reduce (file.cu:42)": where f waits. */
void append_site(const Fiber* f) {
  append("%s in %s (%s:%d)", kOpNames[f->op], f->func, f->file, f->line);
}

/* ---------------------------------------------------------------------------------------------
 * Fibers. */

void fiber_main();

/* Prepares f to start fiber_main on its empty stack when it is next switched to. */
void fiber_reset(Fiber* f) {
  f->state = RUNNABLE;
#ifdef DT_SIMT_VALGRIND
  VALGRIND_MAKE_MEM_UNDEFINED(f->stack, (size_t)(f->top - f->stack)); /* a fresh stack */
#endif
#ifdef DT_SIMT_USE_UCONTEXT
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = f->stack;
  f->uc.uc_stack.ss_size = (size_t)(f->top - f->stack);
  f->uc.uc_link = nullptr;
  makecontext(&f->uc, fiber_main, 0);
#else
  void** sp = (void**)f->top; /* 16-byte aligned */
#if defined(__x86_64__)
  *--sp = nullptr;                              /* fiber_main's return address: never used */
  *--sp = reinterpret_cast<void*>(&fiber_main); /* where the switch's ret goes */
  for (int i = 0; i < 6; i++) *--sp = nullptr;  /* rbp rbx r12-r15 */
#else
  sp -= 20; /* the 160-byte register frame */
  memset(sp, 0, 160);
  sp[11] = reinterpret_cast<void*>(&fiber_main); /* x30, where the switch's ret goes */
#endif
  f->sp = sp;
#endif
}

/* Switches from `from` to `to`, each a fiber or NULL for the scheduler; returns when someone
 * switches back to `from` (never when from_done). Fibers hand over to each other directly, so
 * a sweep over n runnable fibers costs n + 1 switches, not 2n. */
void switch_to(Fiber* from, Fiber* to, bool from_done) {
  g_cur = to;
  if (to != nullptr) dt_simt_thread_idx = &to->tid;
#ifdef DT_SIMT_ASAN
  void** fake = from != nullptr ? &from->fake_stack : &g_sched_fake;
  __sanitizer_start_switch_fiber(
      from_done ? nullptr : fake, to != nullptr ? to->stack : g_sched_stack,
      to != nullptr ? (size_t)(to->top - to->stack) : g_sched_stack_size);
#else
  (void)from_done;
#endif
#ifdef DT_SIMT_USE_UCONTEXT
  swapcontext(from != nullptr ? &from->uc : &g_sched_uc, to != nullptr ? &to->uc : &g_sched_uc);
#else
  dt__simt_switch(from != nullptr ? &from->sp : &g_sched_sp, to != nullptr ? to->sp : g_sched_sp);
#endif
#ifdef DT_SIMT_ASAN
  __sanitizer_finish_switch_fiber(*fake, nullptr, nullptr);
#endif
}

/* f stops running (waiting, yielding or done): the next runnable fiber after it in thread
 * order runs, or the scheduler when there is none or the launch failed. */
void leave(Fiber* f, bool done) {
  Fiber* next = nullptr;
  if (!g_launch.error) {
    for (unsigned i = index_of(f) + 1; i < g_launch.nthreads; i++) {
      if (g_fibers[i].state == RUNNABLE) {
        next = &g_fibers[i];
        break;
      }
    }
  }
  switch_to(f, next, done);
}

/* Ends the launch from inside fiber f, after begin_error/append wrote the message. */
[[noreturn]] void fail_here(Fiber* f) {
  f->state = EXITED;
  leave(f, true);
  __builtin_unreachable();
}

/* Releases the block barrier. Every thread that has not exited waits at it (that is the
 * condition), so all of them get the reduction and run again. */
void release_block() {
  Launch& L = g_launch;
  int op = L.bar_first->op;
  uint64_t r = op == DT_SIMT_OP_SYNC_COUNT ? L.bar_count
               : op == DT_SIMT_OP_SYNC_AND ? (L.bar_count == L.n_bar)
               : op == DT_SIMT_OP_SYNC_OR  ? (L.bar_count != 0)
                                           : 0;
  for (unsigned i = 0; i < L.nthreads; i++) {
    Fiber& f = g_fibers[i];
    if (f.state != EXITED) {
      f.result = r;
      f.state = RUNNABLE;
    }
  }
  L.n_bar = L.bar_count = 0;
  L.bar_first = nullptr;
}

/* The lane a shuffle of lane `lane` reads, as PTX's shfl.sync defines it: the width becomes a
 * segment mask, and a source outside the lane's segment (or the warp) reads the lane's own
 * value; xor may read from an earlier segment, not from a later one. */
int shuffle_source(int op, int lane, int arg, int width) {
  int seg = (32 - width) & 31; /* the lane bits that select the segment */
  int clamp = op == DT_SIMT_OP_SHFL_UP ? 0 : 31;
  int max_lane = (lane & seg) | (clamp & ~seg);
  int b = arg & 31, j;
  bool ok;
  switch (op) {
    case DT_SIMT_OP_SHFL_UP:
      j = lane - b;
      ok = j >= max_lane;
      break;
    case DT_SIMT_OP_SHFL_DOWN:
      j = lane + b;
      ok = j <= max_lane;
      break;
    case DT_SIMT_OP_SHFL_XOR:
      j = lane ^ b;
      ok = j <= max_lane;
      break;
    default: /* DT_SIMT_OP_SHFL_IDX */
      j = (lane & seg) | (b & ~seg);
      ok = j <= max_lane;
      break;
  }
  return ok ? j : lane;
}

/* Releases a warp operation: every lane of `mask` (all waiting at op) gets its result. */
void release_warp(Fiber* warp, unsigned mask, int op) {
  unsigned ballot = 0;
  for (unsigned m = mask; m != 0; m &= m - 1) {
    int k = __builtin_ctz(m);
    if (warp[k].value != 0) ballot |= 1u << k;
  }
  for (unsigned m = mask; m != 0; m &= m - 1) {
    int k = __builtin_ctz(m);
    Fiber& f = warp[k];
    switch (op) {
      case DT_SIMT_OP_SYNCWARP:
        f.result = 0;
        break;
      case DT_SIMT_OP_BALLOT:
        f.result = ballot;
        break;
      case DT_SIMT_OP_ANY:
        f.result = ballot != 0;
        break;
      case DT_SIMT_OP_ALL:
        f.result = ballot == mask;
        break;
      default: {
        int j = shuffle_source(op, k, f.arg, f.width);
        f.result = (mask >> j) & 1u ? warp[j].value : ~(uint64_t)0;
        break;
      }
    }
    f.state = RUNNABLE;
  }
}

/* Where every thread is when nothing can run, in runs of threads waiting at the same place. */
void report_deadlock() {
  unsigned n = g_launch.nthreads;
  begin_error(DT_SIMT_ERR_LAUNCH_FAILED, nullptr);
  append("deadlock: no thread can run (%u of %u threads have returned)", g_launch.n_exited, n);
  for (unsigned i = 0; i < n;) {
    const Fiber& f = g_fibers[i];
    unsigned j = i + 1;
    if (f.state != WAITING) {
      while (j < n && g_fibers[j].state == f.state) j++;
      i = j;
      continue;
    }
    while (j < n && g_fibers[j].state == WAITING && g_fibers[j].op == f.op &&
           g_fibers[j].line == f.line && g_fibers[j].file == f.file &&
           (is_block_op(f.op) || (j % 32 != 0 && g_fibers[j].mask == f.mask)))
      j++;
    const Fiber& l = g_fibers[j - 1];
    append("\n  threads (%u,%u,%u)..(%u,%u,%u) wait at ", f.tid.x, f.tid.y, f.tid.z, l.tid.x,
           l.tid.y, l.tid.z);
    append_site(&f);
    if (!is_block_op(f.op)) {
      unsigned w = i / 32, arrived = 0;
      for (unsigned g = 0; g < g_launch.n_groups[w]; g++)
        if (g_launch.groups[w][g].op == f.op && g_launch.groups[w][g].mask == f.mask)
          arrived = g_launch.groups[w][g].arrived;
      append(" with mask 0x%08x, for lanes 0x%08x", f.mask, f.mask & ~arrived);
    }
    i = j;
  }
}

/* Runs the kernel body as the current fiber, then does the bookkeeping of its exit. */
void fiber_main() {
#ifdef DT_SIMT_ASAN
  /* The launch's first switch comes from the scheduler: it tells where the scheduler's stack is. */
  bool first = g_sched_stack == nullptr;
  __sanitizer_finish_switch_fiber(nullptr, first ? &g_sched_stack : nullptr,
                                  first ? &g_sched_stack_size : nullptr);
#endif
  Fiber* f = g_cur;
  bool threw = false;
  char what[256] = "";
  try {
    g_launch.desc->body(g_launch.desc->ctx);
  } catch (const std::exception& e) { /* leave the handler first: it must not stay open on an
                                         abandoned stack */
    threw = true;
    snprintf(what, sizeof what, ": %s", e.what());
  } catch (...) {
    threw = true;
  }
  if (threw) {
    begin_error(DT_SIMT_ERR_LAUNCH_FAILED, f);
    append("a C++ exception left the kernel%s", what);
    fail_here(f);
  }
  unsigned i = index_of(f), w = i / 32, bit = 1u << (i % 32);
  f->state = EXITED;
  g_launch.n_exited++;
  g_launch.exited[w] |= bit;
  for (unsigned g = 0; g < g_launch.n_groups[w]; g++) {
    const Group& grp = g_launch.groups[w][g];
    if (grp.mask & bit) {
      const Fiber& waiter = g_fibers[w * 32 + __builtin_ctz(grp.arrived)];
      begin_error(DT_SIMT_ERR_LAUNCH_FAILED, f);
      append("thread returned while lane %u of its warp waits for it at ", index_of(&waiter) % 32);
      append_site(&waiter);
      append(" with mask 0x%08x", grp.mask);
      break;
    }
  }
  if (g_launch.n_bar > 0 && g_launch.n_bar + g_launch.n_exited == g_launch.nthreads)
    release_block();
  leave(f, true);
  __builtin_unreachable();
}

/* Makes sure n fiber slots with stacks exist. New slots come in one mapping, each slot a guard,
 * the stack and one spare page. The spare page and a shift of the stack's start by a multiple
 * of 64 bytes give the fibers' busy stack tops different cache sets: with a power-of-two slot
 * size they would all share one L2 set, which made switching between 1024 fibers 2x slower. */
bool reserve_fibers(unsigned n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (g_stack_bytes == 0) {
    long kb = 64;
    const char* env = getenv("DTENSOR_SIMT_STACK_KB");
    if (env != nullptr && atol(env) >= 16) kb = atol(env);
    g_stack_bytes = ((size_t)kb * 1024 + page - 1) / page * page;
  }
  size_t have = g_fibers.size(), slot = kGuardBytes + g_stack_bytes + page;
  if (have >= n) return true;
  unsigned char* p =
      static_cast<unsigned char*>(mmap(nullptr, (n - have) * slot, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (p == MAP_FAILED) return false;
  for (size_t i = have; i < n; i++, p += slot) {
    if (mprotect(p, kGuardBytes, PROT_NONE) != 0) return false; /* the rest stays mapped */
    Fiber f{};
    f.stack = p + kGuardBytes;
    f.top = p + slot - (i / 32 % 64) * 64;
#ifdef DT_SIMT_VALGRIND
    VALGRIND_STACK_REGISTER(f.stack, p + slot);
#endif
    g_fibers.push_back(f);
  }
  return true;
}

/* Runs one block to completion; false when the launch failed. */
bool run_block(const dt_simt_launch_desc_t* d, dt_simt_uint3 bid) {
  Launch& L = g_launch;
  unsigned n = L.nthreads, bx = d->block.x, bxy = d->block.x * d->block.y;
  L.block_idx = bid;
  L.n_exited = L.n_bar = L.bar_count = 0;
  L.bar_first = nullptr;
  for (unsigned w = 0; w < 32; w++) {
    unsigned first = w * 32;
    L.lanes[w] = first >= n ? 0u : n - first >= 32 ? ~0u : (1u << (n - first)) - 1u;
    L.exited[w] = L.n_groups[w] = 0;
  }
  /* Shared memory starts undefined on a GPU: poison it so that early reads show. */
  memset(L.dyn_smem, 0xFF, d->smem_bytes);
  for (unsigned i = 0; i < n; i++) {
    Fiber& f = g_fibers[i];
    f.tid = dt_simt_uint3{i % bx, (i / bx) % d->block.y, i / bxy};
    fiber_reset(&f);
  }
  for (;;) { /* each turn is a sweep: fibers hand over in thread order, the last returns here */
    Fiber* first = nullptr;
    for (unsigned i = 0; i < n && first == nullptr; i++)
      if (g_fibers[i].state == RUNNABLE) first = &g_fibers[i];
    if (first == nullptr) {
      if (L.n_exited == n) return true;
      report_deadlock();
      return false;
    }
    switch_to(nullptr, first, false);
    if (L.error) return false;
  }
}

int run_launch(const dt_simt_launch_desc_t* d) {
  Launch& L = g_launch;
  const dt_simt_uint3 &g = d->grid, &b = d->block;
  unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 ||
      b.y > 1024 || b.z > 64 || threads > 1024 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
    begin_error(DT_SIMT_ERR_INVALID_CONFIG, nullptr);
    append(
        "invalid launch configuration: grid (%u,%u,%u), block (%u,%u,%u); every dimension "
        "must be at least 1, a block at most (1024,1024,64) and 1024 threads, a grid at most "
        "(2^31-1,65535,65535)",
        g.x, g.y, g.z, b.x, b.y, b.z);
    return L.error;
  }
  if (d->smem_bytes > kMaxDynSmem) {
    begin_error(DT_SIMT_ERR_INVALID_CONFIG, nullptr);
    append(
        "%zu bytes of dynamic shared memory requested; the limit is %zu (228 KiB; on the GPU "
        "more than 48 KiB also needs cudaFuncAttributeMaxDynamicSharedMemorySize)",
        d->smem_bytes, kMaxDynSmem);
    return L.error;
  }
  if (!reserve_fibers((unsigned)threads)) {
    begin_error(DT_SIMT_ERR_OUT_OF_MEMORY, nullptr);
    append("cannot map %llu fiber stacks of %zu bytes", threads, g_stack_bytes);
    return L.error;
  }
  /* Exactly smem_bytes (at least 1), so that AddressSanitizer sees overruns; 128-byte aligned
   * like a GPU's (wmma loads need 32). */
  void* smem = nullptr;
  if (posix_memalign(&smem, 128, d->smem_bytes ? d->smem_bytes : 1) != 0) smem = nullptr;
  L.dyn_smem = static_cast<unsigned char*>(smem);
  if (L.dyn_smem == nullptr) {
    begin_error(DT_SIMT_ERR_OUT_OF_MEMORY, nullptr);
    append("cannot allocate %zu bytes of dynamic shared memory", d->smem_bytes);
    return L.error;
  }
  L.nthreads = (unsigned)threads;
  dt_simt_block_dim = &d->block;
  dt_simt_grid_dim = &d->grid;
  dt_simt_block_idx = &L.block_idx;
  bool ok = true;
  for (unsigned z = 0; ok && z < g.z; z++)
    for (unsigned y = 0; ok && y < g.y; y++)
      for (unsigned x = 0; ok && x < g.x; x++) ok = run_block(d, dt_simt_uint3{x, y, z});
#ifdef DT_SIMT_ASAN
  /* Abandoned fibers leave the shadow of their live frames poisoned. */
  if (!ok)
    for (unsigned i = 0; i < L.nthreads; i++)
      __asan_unpoison_memory_region(g_fibers[i].stack, g_fibers[i].top - g_fibers[i].stack);
#endif
  free(L.dyn_smem);
  return L.error;
}

} /* namespace */

/* ---------------------------------------------------------------------------------------------
 * Entry points. */

const dt_simt_uint3* dt_simt_thread_idx;
const dt_simt_uint3* dt_simt_block_idx;
const dt_simt_uint3* dt_simt_block_dim;
const dt_simt_uint3* dt_simt_grid_dim;

int dt_simt_run(const dt_simt_launch_desc_t* desc) {
  if (t_in_launch) { /* the lock below would never be released */
    snprintf(t_last_error, sizeof t_last_error,
             "dt_simt: a kernel launched a kernel; the emulator runs one launch at a time");
    return t_last_rc = DT_SIMT_ERR_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  t_in_launch = true;
  g_launch = Launch{};
  g_launch.desc = desc;
  g_msg[0] = '\0';
#ifdef DT_SIMT_ASAN
  g_sched_stack = nullptr;
#endif
  int rc = run_launch(desc);
  dt_simt_thread_idx = dt_simt_block_idx = dt_simt_block_dim = dt_simt_grid_dim = nullptr;
  g_launch.desc = nullptr;
  memcpy(t_last_error, g_msg, sizeof g_msg);
  t_last_rc = rc;
  t_in_launch = false;
  return rc;
}

const char* dt_simt_last_error(void) { return t_last_error; }

const char* dt_simt_error_string(int rc) {
  if (rc != 0 && rc == t_last_rc && t_last_error[0] != '\0') return t_last_error;
  switch (rc) {
    case DT_SIMT_OK: return "no error";
    case DT_SIMT_ERR_INVALID_VALUE: return "invalid argument";
    case DT_SIMT_ERR_OUT_OF_MEMORY: return "out of memory";
    case DT_SIMT_ERR_INVALID_CONFIG: return "invalid configuration argument";
    case DT_SIMT_ERR_LAUNCH_FAILED: return "unspecified launch failure";
    default: return "unknown error";
  }
}

void* dt_simt_dyn_smem(void) { return g_launch.dyn_smem; }

int dt_simt_block_sync(int op, int pred, const char* file, int line, const char* func) {
  Fiber* f = g_cur;
  if (f == nullptr) return 0; /* not inside a launch */
  Launch& L = g_launch;
  const Fiber* first = L.bar_first;
  f->op = op, f->file = file, f->line = line, f->func = func;
  if (first != nullptr && (first->op != op || first->line != line ||
                           (first->file != file && strcmp(first->file, file) != 0))) {
    begin_error(DT_SIMT_ERR_LAUNCH_FAILED, f);
    append_site(f);
    append(" while thread (%u,%u,%u) waits at ", first->tid.x, first->tid.y, first->tid.z);
    append_site(first);
    append(
        "; threads waiting at different block barriers are undefined in CUDA (sm_70+ "
        "hardware would release both together)");
    fail_here(f);
  }
  L.bar_count += pred != 0;
  f->state = WAITING;
  if (first == nullptr) L.bar_first = f;
  if (++L.n_bar + L.n_exited == L.nthreads) {
    release_block(); /* the last to arrive releases everyone and goes on */
  } else {
    leave(f, false);
  }
  return (int)f->result;
}

uint64_t dt_simt_warp_sync(int op, unsigned mask, uint64_t value, int arg, int width,
                           const char* file, int line, const char* func) {
  Fiber* f = g_cur;
  if (f == nullptr) return value;
  Launch& L = g_launch;
  unsigned i = index_of(f), w = i / 32, lane = i % 32, bit = 1u << lane;
  Fiber* warp = &g_fibers[w * 32];
  unsigned m = mask & L.lanes[w];
  f->op = op, f->file = file, f->line = line, f->func = func;
  f->mask = m;
  f->value = value;
  f->arg = arg;
  f->width = width;
  if (!(mask & bit)) {
    begin_error(DT_SIMT_ERR_LAUNCH_FAILED, f);
    append_site(f);
    append(" with mask 0x%08x, which does not contain the calling lane %u", mask, lane);
    fail_here(f);
  }
  if (op >= DT_SIMT_OP_SHFL_IDX && op <= DT_SIMT_OP_SHFL_XOR &&
      (width < 1 || width > 32 || (width & (width - 1)) != 0)) {
    begin_error(DT_SIMT_ERR_LAUNCH_FAILED, f);
    append_site(f);
    append(" with width %d; it must be a power of two from 1 to 32", width);
    fail_here(f);
  }
  if (m & L.exited[w]) {
    begin_error(DT_SIMT_ERR_LAUNCH_FAILED, f);
    append_site(f);
    append(" with mask 0x%08x, but lanes 0x%08x of the mask have returned", mask, m & L.exited[w]);
    fail_here(f);
  }
  /* Join the group of this operation and mask. A lane of the mask waiting elsewhere for this
   * lane can never meet it: an error. (Lanes of the mask waiting elsewhere without this lane in
   * their mask are fine: they come here once their own group is complete.) */
  Group* groups = L.groups[w];
  Group* mine = nullptr;
  for (unsigned g = 0; g < L.n_groups[w]; g++) {
    if (groups[g].op == op && groups[g].mask == m) {
      mine = &groups[g];
    } else if ((groups[g].arrived & m) && (groups[g].mask & bit)) {
      const Fiber& other = warp[__builtin_ctz(groups[g].arrived & m)];
      begin_error(DT_SIMT_ERR_LAUNCH_FAILED, f);
      append_site(f);
      append(" with mask 0x%08x while lane %u waits for this lane at ", m, index_of(&other) % 32);
      append_site(&other);
      append(
          " with mask 0x%08x; the lanes of a mask must meet at the same warp operation with "
          "the same mask",
          other.mask);
      fail_here(f);
    }
  }
  if (mine == nullptr) {
    mine = &groups[L.n_groups[w]++];
    *mine = Group{op, m, 0u};
  }
  mine->arrived |= bit;
  if (mine->arrived == m) {
    release_warp(warp, m, op); /* the last to arrive releases the others and goes on */
    *mine = groups[--L.n_groups[w]];
  } else {
    f->state = WAITING;
    leave(f, false);
  }
  return f->result;
}

unsigned dt_simt_active_mask(void) {
  Fiber* f = g_cur;
  if (f == nullptr) return 0;
  unsigned w = index_of(f) / 32;
  return g_launch.lanes[w] & ~g_launch.exited[w];
}

void dt_simt_yield(void) {
  Fiber* f = g_cur;
  if (f != nullptr) leave(f, false);
}
