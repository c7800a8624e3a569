// Persistent thread pool. Tasks are handed out under the mutex: jobs here have tens to a few
// hundred coarse tasks, so the lock is never the bottleneck.
#include "thread_pool.h"

#include "kvc/core/error.h"

namespace kvc {
namespace mini_decoder {

ThreadPool::ThreadPool(int threads) {
  KVC_CHECK(threads >= 1 && threads <= 1024, "threads = ", threads, " must be in [1, 1024]");
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::run_tasks(int thread) {
  for (;;) {
    int task;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (next_task_ >= num_tasks_ || error_) return;
      task = next_task_++;
    }
    try {
      (*fn_)(task, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop(int thread) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_tasks(thread);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int num_tasks, const std::function<void(int, int)>& fn) {
  KVC_CHECK(num_tasks >= 0, "num_tasks = ", num_tasks, " must be >= 0");
  if (num_tasks == 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (int t = 0; t < num_tasks; ++t) fn(t, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    num_tasks_ = num_tasks;
    next_task_ = 0;
    error_ = nullptr;
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  run_tasks(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return busy_ == 0; });
    fn_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace mini_decoder
}  // namespace kvc
