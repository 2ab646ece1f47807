#include "pool.h"

#include <unistd.h>

#include <stdexcept>
#include <string>

namespace fastload {

ThreadPool::ThreadPool(int num_threads) : sh_(new Shared), owner_pid_(getpid()) {
  if (num_threads < 0) {
    throw std::invalid_argument("num_threads must be >= 0, got " + std::to_string(num_threads));
  }
  threads_.reserve(num_threads);
  try {
    for (int i = 0; i < num_threads; ++i) threads_.emplace_back(&ThreadPool::worker_loop, this, i);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(sh_->mu);
      sh_->stop = true;
    }
    sh_->work_cv.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  if (getpid() != owner_pid_) {  // forked child: see Shared
    // The threads do not exist here: detach()/join() on their stale handles is undefined (glibc may
    // answer EINVAL, and the std::system_error from a destructor aborts the child, e.g. a torch worker
    // that garbage-collects a pool it inherited). A joinable std::thread must not be destroyed either,
    // so the handles are leaked with the shared state: a few bytes, once per inherited pool.
    new std::vector<std::thread>(std::move(threads_));
    sh_.release();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(sh_->mu);
    sh_->stop = true;
  }
  sh_->work_cv.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run_inline(int64_t n, const Task& fn) {
  for (int64_t i = 0; i < n; ++i) fn(i, 0);
}

bool ThreadPool::ran_without_threads(int64_t n, const Task& fn) {
  if (n <= 0) return true;
  if (getpid() != owner_pid_) {
    std::lock_guard<std::mutex> fork_lock(sh_->fork_mu);
    run_inline(n, fn);
    return true;
  }
  return false;
}

void ThreadPool::publish(int64_t n, const Task& fn, int busy, bool shared) {
  Shared& s = *sh_;
  s.task = &fn;
  s.num_tasks = n;
  s.next.store(0, std::memory_order_relaxed);
  s.error = nullptr;
  s.busy = busy;
  s.shared = shared;
}

void ThreadPool::run(int64_t n, const Task& fn) {
  if (ran_without_threads(n, fn)) return;
  Shared& s = *sh_;
  std::lock_guard<std::mutex> run_lock(s.run_mu);
  if (threads_.empty()) {
    run_inline(n, fn);
    return;
  }
  std::unique_lock<std::mutex> lock(s.mu);
  publish(n, fn, size(), false);
  ++s.generation;
  s.work_cv.notify_all();
  s.done_cv.wait(lock, [&s] { return s.busy == 0; });
  s.task = nullptr;
  if (s.error) {
    std::exception_ptr e = s.error;
    s.error = nullptr;
    std::rethrow_exception(e);
  }
}

void ThreadPool::run_shared(int64_t n, const Task& fn, int helpers) {
  if (ran_without_threads(n, fn)) return;
  Shared& s = *sh_;
  std::lock_guard<std::mutex> run_lock(s.run_mu);
  if (helpers < 0 || helpers > size()) helpers = size();
  if (helpers == 0) {
    run_inline(n, fn);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    publish(n, fn, 0, true);  // busy: counted up by each thread that joins while the run is open
    s.closed = false;
    s.joinable = helpers;
    ++s.generation;
  }
  // a thread not waiting yet sees the new generation when it comes back; one woken past the
  // limit goes back to sleep
  if (helpers == size()) {
    s.work_cv.notify_all();
  } else {
    for (int i = 0; i < helpers; ++i) s.work_cv.notify_one();
  }
  std::exception_ptr err;
  const int me = size();
  for (;;) {
    const int64_t i = s.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= n) break;
    try {
      fn(i, me);
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  }
  std::unique_lock<std::mutex> lock(s.mu);
  s.closed = true;  // a thread not woken yet skips this generation
  s.done_cv.wait(lock, [&s] { return s.busy == 0; });
  s.task = nullptr;
  if (!err) err = s.error;
  s.error = nullptr;
  if (err) std::rethrow_exception(err);
}

void ThreadPool::worker_loop(int worker) {
  Shared& s = *sh_;
  uint64_t seen = 0;
  for (;;) {
    const Task* task;
    int64_t n;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      s.work_cv.wait(lock, [&] { return s.stop || s.generation != seen; });
      if (s.stop) return;
      seen = s.generation;
      if (s.shared) {
        // the caller took every task and returned (or is returning), or enough threads joined
        if (s.closed || s.joinable == 0) continue;
        --s.joinable;
        ++s.busy;
      }
      task = s.task;
      n = s.num_tasks;
    }
    std::exception_ptr err;
    for (;;) {
      const int64_t i = s.next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) break;
      try {
        (*task)(i, worker);
      } catch (...) {
        if (!err) err = std::current_exception();
      }
    }
    std::lock_guard<std::mutex> lock(s.mu);
    if (err && !s.error) s.error = err;
    if (--s.busy == 0) s.done_cv.notify_one();
  }
}

}  // namespace fastload
