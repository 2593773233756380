/*
 * cuda_emu.h -- run polyc's generated CUDA on the CPU (polyc.codegen.cuda, emulate=True).
 *
 * Force-included into the very .cu file nvcc builds:
 *     g++ -std=c++17 -x c++ -include cuda_emu.h -shared -fPIC kernel.cu
 *
 * Model: blocks run one after another; the threads of a block are fibers (own stack,
 * cooperative). A fiber runs until it reaches __syncthreads() or returns; the scheduler
 * then resumes the next thread, in forward or reverse order (polyc_emu_set_order, or
 * POLYC_EMU_ORDER=forward|reverse). A correct kernel gives the same bits in both orders;
 * a missing barrier between a write and a read of another thread shows up as a
 * difference. Checked, reported as CUDA error codes (cudaGetLastError) with a message
 * (cudaGetErrorString), never by aborting:
 *   - launch configuration: block <= 1024 threads, block z <= 64, grid y/z <= 65535,
 *     no zero dimension (cudaErrorInvalidConfiguration);
 *   - every pointer argument of a launch points into a cudaMalloc'ed block
 *     (a host pointer passed to a kernel: cudaErrorIllegalAddress);
 *   - every barrier round: all live threads wait at the same __syncthreads() line, and
 *     none has returned while others wait (divergent barrier: cudaErrorLaunchFailure);
 *   - cudaMemcpy's direction matches its pointers, cudaFree takes a device pointer
 *     (cudaErrorInvalidValue).
 * __shared__ arrays become static: one copy, correct because blocks run in sequence.
 * The emulator's state is global to the library: one launch at a time (not thread-safe);
 * the fibers of the largest block launched so far are kept (64 KiB of stack each).
 * Fibers switch with a few lines of x86-64 assembly, or ucontext elsewhere and under
 * the sanitizers (define POLYC_EMU_UCONTEXT).
 */
#ifndef POLYC_CUDA_EMU_H
#define POLYC_CUDA_EMU_H

#ifdef POLYC_EMU_DEVICE_LIBRARY
/* The emulated device's memory, one per process: built by itself from this header
 *     g++ -x c++ -DPOLYC_EMU_DEVICE_LIBRARY -shared -fPIC cuda_emu.h
 * and loaded with RTLD_GLOBAL, so that every emulated library's weak references bind
 * to it. The blocks, start -> bytes, under a lock. */
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace {
std::map<std::uintptr_t, std::size_t> blocks;
std::mutex lock;
}  // namespace

extern "C" __attribute__((visibility("default"))) void polyc_emu_device_add(
    std::uintptr_t start, std::size_t bytes) {
  std::lock_guard<std::mutex> hold(lock);
  blocks[start] = bytes;
}
extern "C" __attribute__((visibility("default"))) int polyc_emu_device_remove(
    std::uintptr_t start) {
  std::lock_guard<std::mutex> hold(lock);
  return blocks.erase(start) != 0;
}
extern "C" __attribute__((visibility("default"))) int polyc_emu_device_holds(
    std::uintptr_t a, std::size_t bytes) {
  std::lock_guard<std::mutex> hold(lock);
  auto it = blocks.upper_bound(a);
  if (it == blocks.begin()) return 0;
  --it;
  return a >= it->first && a + bytes <= it->first + (it->second ? it->second : 1);
}
#else /* the emulation itself */

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#if !defined(__x86_64__) && !defined(POLYC_EMU_UCONTEXT)
#define POLYC_EMU_UCONTEXT 1
#endif
#ifdef POLYC_EMU_UCONTEXT
#include <ucontext.h>
#endif

#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)
#define POLYC_EXPORT extern "C" __attribute__((visibility("default")))

struct uint3 { unsigned x, y, z; };
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

typedef int cudaError_t;
enum {
  cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9, cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100, cudaErrorIllegalAddress = 700, cudaErrorLaunchFailure = 719
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3
};

/* the process-wide registry of device blocks (weak: absent unless the emulated device
 * library, built from this header with POLYC_EMU_DEVICE_LIBRARY, is loaded globally) */
extern "C" {
__attribute__((weak, visibility("default"))) void polyc_emu_device_add(std::uintptr_t,
                                                                         std::size_t);
__attribute__((weak, visibility("default"))) int polyc_emu_device_remove(std::uintptr_t);
__attribute__((weak, visibility("default"))) int polyc_emu_device_holds(std::uintptr_t,
                                                                          std::size_t);
}

namespace polyc_emu {

inline uint3 thread_index, block_index;
inline dim3 block_dim, grid_dim;
inline std::map<std::uintptr_t, std::size_t> allocations;  // device blocks: start -> bytes
inline cudaError_t last_error = cudaSuccess;                // cleared by cudaGetLastError
inline cudaError_t sticky_error = cudaSuccess;              // returned by later calls
inline std::string detail;                                  // message of the last error
inline int order = -1;                                      // 0 forward, 1 reverse, -1 env

inline cudaError_t fail(cudaError_t code, const std::string &why) {
  last_error = code;
  detail = why;
  return code;
}

/* whether [a, a + bytes) lies inside one block of ``blocks`` */
inline bool holds(const std::map<std::uintptr_t, std::size_t> &blocks, std::uintptr_t a,
                  std::size_t bytes) {
  auto it = blocks.upper_bound(a);
  if (it == blocks.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + (it->second ? it->second : 1);
}

/* The device blocks: the process-wide registry when the emulated device library is
 * loaded (polyc loads it, RTLD_GLOBAL, before any emulated library: then a block
 * cudaMalloc'ed by one library is a device pointer for all of them, as on a GPU), else
 * this library's own map (a C program that links one emulated library by itself). */
inline void add_block(const void *p, std::size_t bytes) {
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
  if (polyc_emu_device_add) polyc_emu_device_add(a, bytes);
  else allocations[a] = bytes;
}
inline bool remove_block(const void *p) {
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
  if (polyc_emu_device_remove) return polyc_emu_device_remove(a) != 0;
  return allocations.erase(a) != 0;
}
/* the device block holding [p, p + bytes), or false */
inline bool on_device(const void *p, std::size_t bytes = 1) {
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
  if (polyc_emu_device_holds) return polyc_emu_device_holds(a, bytes) != 0;
  return holds(allocations, a, bytes);
}

inline bool reverse_order() {
  if (order >= 0) return order == 1;
  const char *env = std::getenv("POLYC_EMU_ORDER");
  return env && std::strcmp(env, "reverse") == 0;
}

/* -- fibers --------------------------------------------------------------------- */

#ifdef __SANITIZE_ADDRESS__
constexpr std::size_t STACK_BYTES = 256 * 1024;
#else
constexpr std::size_t STACK_BYTES = 64 * 1024;
#endif

struct Fiber {
  std::unique_ptr<unsigned char[]> stack;  // STACK_BYTES, allocated on first use
#ifdef POLYC_EMU_UCONTEXT
  ucontext_t context;
#else
  void *sp = nullptr;
#endif
  uint3 index{0, 0, 0};
  bool done = false;
  int barrier = 0;  // __LINE__ of the barrier it waits at (0: none)
};

inline Fiber *current = nullptr;
inline void (*body)() = nullptr;  // runs the kernel with its arguments (set by launch)
#ifdef POLYC_EMU_UCONTEXT
inline ucontext_t scheduler_context;
#else
inline void *scheduler_sp = nullptr;

/* save callee-saved registers on this stack, store rsp in *from, load rsp = to, pop */
__attribute__((naked, noinline)) static void switch_stack(void ** /*from*/, void * /*to*/) {
  __asm__ volatile(
      "pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
      "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
      "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\t"
      "ret\n\t");
}
#endif

inline void to_scheduler() {
#ifdef POLYC_EMU_UCONTEXT
  swapcontext(&current->context, &scheduler_context);
#else
  switch_stack(&current->sp, scheduler_sp);
#endif
}

[[noreturn]] inline void fiber_main() {
  body();
  current->done = true;
  to_scheduler();
  std::abort();  // a finished fiber is never resumed
}

inline void start(Fiber &f) {
  f.done = false;
  f.barrier = 0;
  if (!f.stack) f.stack.reset(new unsigned char[STACK_BYTES]);
#ifdef POLYC_EMU_UCONTEXT
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack.get();
  f.context.uc_stack.ss_size = STACK_BYTES;
  f.context.uc_link = nullptr;
  makecontext(&f.context, reinterpret_cast<void (*)()>(&fiber_main), 0);
#else
  /* the first switch "returns" into fiber_main with rsp + 8 a multiple of 16 */
  std::uintptr_t top = reinterpret_cast<std::uintptr_t>(f.stack.get() + STACK_BYTES);
  top &= ~static_cast<std::uintptr_t>(15);
  void **sp = reinterpret_cast<void **>(top - 16);
  sp[1] = nullptr;                                         // fiber_main's return address
  sp[0] = reinterpret_cast<void *>(&fiber_main);           // popped by ret
  sp -= 6;                                                 // rbp rbx r12..r15
  for (int i = 0; i < 6; ++i) sp[i] = nullptr;
  f.sp = sp;
#endif
}

inline void resume(Fiber &f) {
  current = &f;
  thread_index = f.index;
#ifdef POLYC_EMU_UCONTEXT
  swapcontext(&scheduler_context, &f.context);
#else
  switch_stack(&scheduler_sp, f.sp);
#endif
  current = nullptr;
}

inline void barrier(int line) {
  if (!current) return;  // host code: nothing to wait for
  current->barrier = line;
  to_scheduler();
}

/* run one block: rounds of "every live thread to its next barrier or its end" */
inline bool run_block(Fiber *fibers, std::size_t n, const char *kernel) {
  for (std::size_t i = 0; i < n; ++i) start(fibers[i]);
  const bool reverse = reverse_order();
  for (;;) {
    for (std::size_t i = 0; i < n; ++i) {
      Fiber &f = fibers[reverse ? n - 1 - i : i];
      if (!f.done) {
        f.barrier = 0;
        resume(f);
      }
    }
    std::size_t finished = 0;
    int line = 0;
    bool mixed = false;
    for (std::size_t i = 0; i < n; ++i) {
      const Fiber &f = fibers[i];
      if (f.done) { ++finished; continue; }
      if (line && f.barrier != line) mixed = true;
      line = f.barrier;
    }
    if (finished == n) return true;
    if (finished || mixed) {
      char why[256];
      std::snprintf(why, sizeof why,
                    "divergent __syncthreads() in %s (block %u,%u,%u): %zu of %zu threads "
                    "returned, the others wait at line %d%s", kernel, block_index.x,
                    block_index.y, block_index.z, finished, n, line,
                    mixed ? " or at different barriers" : "");
      fail(cudaErrorLaunchFailure, why);
      sticky_error = cudaErrorLaunchFailure;
      return false;
    }
  }
}

template <typename T>
inline bool argument_ok(const char *kernel, int position, const T &value) {
  if constexpr (std::is_pointer_v<T>) {
    if (value && !on_device(value)) {
      fail(cudaErrorIllegalAddress, std::string("argument ") + std::to_string(position) +
                                        " of " + kernel + " is not a device pointer (a host "
                                        "pointer passed to a kernel?)");
      return false;
    }
  }
  (void)kernel; (void)position; (void)value;
  return true;
}

template <typename... Params, typename... Args>
inline void launch(const char *name, void (*kernel)(Params...), dim3 grid, dim3 block,
                   Args... args) {
  const unsigned long long threads = 1ULL * block.x * block.y * block.z;
  if (!grid.x || !grid.y || !grid.z || !threads || threads > 1024 || block.x > 1024 ||
      block.y > 1024 || block.z > 64 || grid.y > 65535 || grid.z > 65535) {
    char why[200];
    std::snprintf(why, sizeof why, "invalid launch of %s: grid (%u,%u,%u), block (%u,%u,%u)",
                  name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
    fail(cudaErrorInvalidConfiguration, why);
    return;
  }
  int position = 0;
  const bool ok = (argument_ok(name, position++, args) && ...);
  if (!ok) return;
  static void (*kernel_now)(Params...);
  static std::tuple<Params...> *args_now;
  std::tuple<Params...> bound(static_cast<Params>(args)...);
  kernel_now = kernel;
  args_now = &bound;
  body = [] { std::apply(kernel_now, *args_now); };
  block_dim = block;
  grid_dim = grid;
  static std::vector<Fiber> pool;  // fibers (and their stacks) kept between launches
  if (pool.size() < threads) pool.resize(threads);
  Fiber *fibers = pool.data();
  std::size_t t = 0;
  for (unsigned z = 0; z < block.z; ++z)
    for (unsigned y = 0; y < block.y; ++y)
      for (unsigned x = 0; x < block.x; ++x) fibers[t++].index = uint3{x, y, z};
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        block_index = uint3{bx, by, bz};
        if (!run_block(fibers, threads, name)) return;
      }
}

}  // namespace polyc_emu

#define threadIdx (polyc_emu::thread_index)
#define blockIdx (polyc_emu::block_index)
#define blockDim (polyc_emu::block_dim)
#define gridDim (polyc_emu::grid_dim)
#define __syncthreads() polyc_emu::barrier(__LINE__)
#define POLYC_LAUNCH(kernel, grid, block, ...) \
  polyc_emu::launch(#kernel, kernel, grid, block, __VA_ARGS__)

/* -- the runtime API the generated host code uses ---------------------------------- */

inline cudaError_t cudaGetDeviceCount(int *count) { *count = 1; return cudaSuccess; }
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = polyc_emu::last_error;
  polyc_emu::last_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaDeviceSynchronize() { return polyc_emu::sticky_error; }
inline const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
  }
}
inline const char *cudaGetErrorString(cudaError_t e) {
  if (e == cudaSuccess) return "no error";
  return polyc_emu::detail.empty() ? "emulated CUDA error" : polyc_emu::detail.c_str();
}
inline cudaError_t cudaMalloc(void **p, std::size_t bytes) {
  *p = std::malloc(bytes ? bytes : 1);
  if (!*p) return polyc_emu::fail(cudaErrorMemoryAllocation, "out of host memory");
  polyc_emu::add_block(*p, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaFree(void *p) {
  if (!p) return cudaSuccess;
  if (!polyc_emu::remove_block(p))
    return polyc_emu::fail(cudaErrorInvalidValue, "cudaFree of a pointer cudaMalloc did not "
                                                  "return");
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void *p, int value, std::size_t bytes) {
  if (!polyc_emu::on_device(p, bytes))
    return polyc_emu::fail(cudaErrorInvalidValue, "cudaMemset outside a device allocation");
  std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void *dst, const void *src, std::size_t bytes, cudaMemcpyKind kind) {
  const bool dst_dev = polyc_emu::on_device(dst, bytes), src_dev = polyc_emu::on_device(src, bytes);
  const bool want_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool want_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (polyc_emu::sticky_error) return polyc_emu::sticky_error;
  if (dst_dev != want_dst || src_dev != want_src)
    return polyc_emu::fail(cudaErrorInvalidValue,
                           "cudaMemcpy: the pointers do not match the direction (or the "
                           "device block is too small)");
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}

/* thread order of the next launches: 0 forward, 1 reverse, -1 POLYC_EMU_ORDER */
POLYC_EXPORT void polyc_emu_set_order(int order) { polyc_emu::order = order; }
/* reset the sticky error of a failed launch (a real device would need a new context) */
POLYC_EXPORT void polyc_emu_reset(void) {
  polyc_emu::sticky_error = cudaSuccess;
  polyc_emu::last_error = cudaSuccess;
}

#endif /* POLYC_EMU_DEVICE_LIBRARY */
#endif /* POLYC_CUDA_EMU_H */
