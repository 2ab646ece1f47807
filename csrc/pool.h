// Persistent thread pool: threads are created once and reused for every batch.
//
// run(n, fn) calls fn(task, worker) for every task in [0, n) and returns when all are done.
// Tasks are handed out one at a time from an atomic counter, so a slow sample does not hold up
// the others. `worker` is in [0, max(size(), 1)) and identifies per-thread scratch state.
// With size() == 0 everything runs in the calling thread (worker 0).
//
// run_shared(n, fn, helpers) is run() with the calling thread taking tasks too (worker id size()),
// with at most `helpers` pool threads: for jobs without per-worker state (the row gather) whose
// caller would otherwise sleep until the threads are done. The caller never waits for a thread that has not started yet: once every task is taken, a
// pool thread that wakes late finds nothing to do and the caller returns without it.
//
// Calls to run() are serialized: two callers sharing a pool take turns. After fork() the child
// has no pool threads, so run() there falls back to the calling thread (and destruction there
// leaves the parent's thread handles alone).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace fastload {

class ThreadPool {
 public:
  using Task = std::function<void(int64_t task, int worker)>;

  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  // Number of distinct `worker` ids run() can pass: max(size(), 1).
  int num_slots() const { return threads_.empty() ? 1 : size(); }

  // Runs fn over [0, n). Rethrows the first exception a task threw (after all tasks finished).
  void run(int64_t n, const Task& fn);
  // Runs fn over [0, n) on the calling thread (worker id size()) and at most `helpers` of the
  // pool's threads (all of them when negative); returns once every task is done, waiting only for
  // threads that joined.
  void run_shared(int64_t n, const Task& fn, int helpers = -1);

 private:
  void worker_loop(int worker);
  void run_inline(int64_t n, const Task& fn);
  // run()'s and run_shared()'s start: true where the call is done already (nothing to run, or a forked child, whose
  // pool has no threads: the calling thread ran it).
  bool ran_without_threads(int64_t n, const Task& fn);
  // Under Shared::mu: fn over [0, n) as the run the threads take next, `busy` of them counted in; `shared`: a
  // run_shared() (threads join while it is open). The caller then bumps the generation.
  void publish(int64_t n, const Task& fn, int busy, bool shared);

  // Everything the threads touch. In a forked child the threads do not exist, and destroying
  // (or signalling) condition variables they were waiting on blocks forever, so there it is
  // deliberately leaked.
  struct Shared {
    std::mutex run_mu;   // serializes run()
    std::mutex fork_mu;  // serializes run() in a forked child (never taken in the parent)
    std::mutex mu;
    std::condition_variable work_cv;
    std::condition_variable done_cv;
    const Task* task = nullptr;
    int64_t num_tasks = 0;
    std::atomic<int64_t> next{0};
    uint64_t generation = 0;
    int busy = 0;
    bool shared = false;  // this generation is a run_shared(): threads join (busy) only while open
    bool closed = false;  // run_shared(): every task is taken, threads that wake now do nothing
    int joinable = 0;     // run_shared(): how many more threads may join
    bool stop = false;
    std::exception_ptr error;
  };
  std::unique_ptr<Shared> sh_;
  std::vector<std::thread> threads_;
  pid_t owner_pid_;
};

}  // namespace fastload
