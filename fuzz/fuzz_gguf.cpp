// Fuzz target: the mini-decoder's GGUF reader (examples/mini_decoder/gguf.h) and its tokenizer
// on arbitrary files. The input is written to an in-memory file (memfd) that gguf::File maps.
// Invariants: File either parses or throws a well-formed kvc::Error; a parsed file's tensors lie
// inside the file; dequantising any tensor (or row) of a supported type reads only its bytes
// (ASan checks); metadata accessors and Tokenizer::from_gguf either work or throw kvc::Error;
// a built tokenizer encodes and decodes arbitrary text without crashing.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "gguf.h"
#include "kvc/core/error.h"
#include "tokenizer.h"

namespace {

using namespace kvc;
using kvc::fuzz::Input;

template <class Fn>
bool ok_or_error(Fn fn) {
  try {
    fn();
    return true;
  } catch (const Error& e) {
    // Messages echo names and keys read from the file escaped (gguf::printable): a NUL in a
    // name must not cut what() short (the check location comes last), and no control byte
    // from the file may reach the message.
    const std::string m = e.what();
    FUZZ_CHECK(m.rfind("kvc: ", 0) == 0 && fuzz::well_formed_error(e), "malformed error: %s",
               e.what());
    for (char ch : m) {
      FUZZ_CHECK(static_cast<unsigned char>(ch) >= 0x20, "control byte %02x in message: %s",
                 static_cast<unsigned char>(ch), e.what());
    }
    return false;
  }
}

int memfd() {
  static int fd = -1;
  if (fd < 0) fd = static_cast<int>(::memfd_create("kvc_fuzz_gguf", 0));
  FUZZ_CHECK(fd >= 0, "memfd_create failed");
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = memfd();
  FUZZ_CHECK(::ftruncate(fd, 0) == 0, "ftruncate");
  std::size_t done = 0;
  while (done < size) {
    const ssize_t w = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    FUZZ_CHECK(w > 0, "pwrite");
    done += static_cast<std::size_t>(w);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  std::unique_ptr<gguf::File> file;
  if (!ok_or_error([&] { file = std::make_unique<gguf::File>(path); })) return 0;

  FUZZ_CHECK(file->file_size() == size, "file size %llu != %zu",
             static_cast<unsigned long long>(file->file_size()), size);
  for (const auto& kv : file->metadata()) {
    ok_or_error([&] { (void)file->get_int(kv.first, 0); });
    ok_or_error([&] { (void)file->get_float(kv.first, 0.0); });
    ok_or_error([&] { (void)file->get_string(kv.first, ""); });
    ok_or_error([&] { (void)kv.second.as_int(); });
  }
  std::uint64_t budget = 1u << 20;  // floats dequantised per input (speed)
  for (const gguf::TensorInfo& t : file->tensors()) {
    FUZZ_CHECK(t.offset <= file->file_size() - file->data_offset() &&
                   t.num_bytes <= file->file_size() - file->data_offset() - t.offset,
               "tensor '%s' lies outside the file", t.name.c_str());
    FUZZ_CHECK(file->find_tensor(t.name) == &t, "find_tensor('%s')", t.name.c_str());
    const gguf::TypeTraits* tr = gguf::type_traits(static_cast<std::uint32_t>(t.type));
    if (tr == nullptr || !tr->dequantizable) continue;
    if (t.row_length() <= budget) {
      std::vector<float> row(static_cast<std::size_t>(t.row_length()));
      ok_or_error([&] { file->dequantize_row(t, t.num_rows() - 1, row.data()); });
      ok_or_error([&] { file->dequantize_row(t, t.num_rows(), row.data()); });  // must throw
      budget -= t.row_length();
    }
    if (t.num_elements <= budget) {
      ok_or_error([&] { (void)file->dequantize_tensor(t); });
      budget -= t.num_elements;
    }
  }
  std::unique_ptr<mini_decoder::Tokenizer> tok;
  if (ok_or_error([&] {
        tok = std::make_unique<mini_decoder::Tokenizer>(mini_decoder::Tokenizer::from_gguf(*file));
      })) {
    const std::string text(reinterpret_cast<const char*>(data), size < 64 ? size : 64);
    std::vector<int> ids;
    if (ok_or_error([&] { ids = tok->encode(text, true); })) {
      for (int id : ids) FUZZ_CHECK(id >= 0 && id < tok->size(), "token id %d", id);
      ok_or_error([&] { (void)tok->decode(ids); });
    }
  }
  return 0;
}
