// A GGUF writer for the tests: builds small files byte by byte, valid or deliberately broken.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace kvc {
namespace testing {

/// Little-endian byte buffer.
class Bytes {
 public:
  template <class T>
  void put(T v) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    data_.insert(data_.end(), b, b + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<std::uint64_t>(s.size());
    data_.insert(data_.end(), s.begin(), s.end());
  }
  void append(const std::vector<std::uint8_t>& b) { data_.insert(data_.end(), b.begin(), b.end()); }
  void pad_to(std::size_t alignment) {
    while (data_.size() % alignment != 0) data_.push_back(0);
  }
  std::vector<std::uint8_t>& data() { return data_; }
  const std::vector<std::uint8_t>& data() const { return data_; }
  std::size_t size() const { return data_.size(); }

 private:
  std::vector<std::uint8_t> data_;
};

/// Collects metadata and tensors and lays them out as GGUF.
class GgufWriter {
 public:
  // Metadata: type id + encoded value bytes.
  void kv_raw(const std::string& key, std::uint32_t type, const Bytes& value) {
    Bytes b;
    b.put_string(key);
    b.put<std::uint32_t>(type);
    b.append(value.data());
    kvs_.push_back(b.data());
  }
  template <class T>
  void kv(const std::string& key, std::uint32_t type, T v) {
    Bytes b;
    b.put<T>(v);
    kv_raw(key, type, b);
  }
  void kv_u32(const std::string& key, std::uint32_t v) { kv(key, 4, v); }
  void kv_f32(const std::string& key, float v) { kv(key, 6, v); }
  void kv_string(const std::string& key, const std::string& s) {
    Bytes b;
    b.put_string(s);
    kv_raw(key, 8, b);
  }
  void kv_strings(const std::string& key, const std::vector<std::string>& v) {
    Bytes b;
    b.put<std::uint32_t>(8);
    b.put<std::uint64_t>(v.size());
    for (const std::string& s : v) b.put_string(s);
    kv_raw(key, 9, b);
  }
  void kv_i32s(const std::string& key, const std::vector<std::int32_t>& v) {
    Bytes b;
    b.put<std::uint32_t>(5);
    b.put<std::uint64_t>(v.size());
    for (std::int32_t x : v) b.put<std::int32_t>(x);
    kv_raw(key, 9, b);
  }

  // Tensors: data laid out in order, each at the next multiple of the alignment.
  void tensor(const std::string& name, const std::vector<std::uint64_t>& dims, std::uint32_t type,
              const std::vector<std::uint8_t>& data) {
    tensors_.push_back(Tensor{name, dims, type, data, ~std::uint64_t{0}});
  }
  void tensor_f32(const std::string& name, const std::vector<std::uint64_t>& dims,
                  const std::vector<float>& v) {
    std::vector<std::uint8_t> d(v.size() * 4);
    std::memcpy(d.data(), v.data(), d.size());
    tensor(name, dims, 0, d);
  }
  /// Overrides the stored offset of the last tensor (for broken files).
  void force_offset(std::uint64_t offset) { tensors_.back().forced_offset = offset; }

  /// The file. `alignment` must match general.alignment when that key is written.
  std::vector<std::uint8_t> build(std::uint32_t version = 3, std::size_t alignment = 32,
                                  std::uint64_t* data_offset = nullptr) const {
    Bytes b;
    b.put<std::uint32_t>(0x46554747u);
    b.put<std::uint32_t>(version);
    b.put<std::uint64_t>(tensors_.size());
    b.put<std::uint64_t>(kvs_.size());
    for (const auto& kv : kvs_) b.append(kv);
    std::vector<std::uint64_t> offsets;
    std::uint64_t off = 0;
    for (const Tensor& t : tensors_) {
      off = (off + alignment - 1) / alignment * alignment;
      offsets.push_back(off);
      off += t.data.size();
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      b.put_string(t.name);
      b.put<std::uint32_t>(static_cast<std::uint32_t>(t.dims.size()));
      for (std::uint64_t d : t.dims) b.put<std::uint64_t>(d);
      b.put<std::uint32_t>(t.type);
      b.put<std::uint64_t>(t.forced_offset != ~std::uint64_t{0} ? t.forced_offset : offsets[i]);
    }
    b.pad_to(alignment);
    if (data_offset) *data_offset = b.size();
    const std::size_t base = b.size();
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      while (b.size() < base + offsets[i]) b.data().push_back(0);
      b.append(tensors_[i].data);
    }
    return b.data();
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<std::uint64_t> dims;
    std::uint32_t type;
    std::vector<std::uint8_t> data;
    std::uint64_t forced_offset;
  };
  std::vector<std::vector<std::uint8_t>> kvs_;
  std::vector<Tensor> tensors_;
};

/// A file in the temp folder that is removed when this goes out of scope.
class TempFile {
 public:
  explicit TempFile(const std::vector<std::uint8_t>& bytes) {
    char name[] = "/tmp/kvc_mini_decoder_test_XXXXXX";
    const int fd = ::mkstemp(name);
    if (fd >= 0) ::close(fd);
    path_ = name;
    write(bytes);
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  void write(const std::vector<std::uint8_t>& bytes) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace testing
}  // namespace kvc
