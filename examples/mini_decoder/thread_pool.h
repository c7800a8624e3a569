/*! \file examples/mini_decoder/thread_pool.h
 *  \brief A small persistent thread pool: parallel_for over task ids, the caller working too.
 */
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvc {
namespace mini_decoder {

/// Fixed set of worker threads that run parallel_for jobs one at a time.
class ThreadPool {
 public:
  /// @param[in] threads total threads including the caller, >= 1
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Total threads (workers + the caller).
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  /// Runs fn(task, thread) for every task in [0, num_tasks), spread over the threads; `thread`
  /// in [0, size()) identifies the thread (for per-thread scratch). Returns when all tasks are
  /// done; the first exception thrown by fn is rethrown here.
  /// @param[in] num_tasks number of tasks, >= 0
  /// @param[in] fn        the work of one task
  void parallel_for(int num_tasks, const std::function<void(int task, int thread)>& fn);

 private:
  void worker_loop(int thread);
  void run_tasks(int thread);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  int busy_ = 0;  // workers still inside the current job
  // The current job.
  const std::function<void(int, int)>* fn_ = nullptr;
  int num_tasks_ = 0;
  int next_task_ = 0;  // guarded by mutex_
  std::exception_ptr error_;
};

}  // namespace mini_decoder
}  // namespace kvc
