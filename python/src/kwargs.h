// Keyword construction of kvc's plain config structs from Python:
// kvc.KvStoreConfig(num_kv_heads=3, head_dim=64, old_format="q8"). A string given for an enum
// field is looked up among that enum's values by name; an unknown field raises AttributeError.
#pragma once

#include <nanobind/nanobind.h>

#include <new>

namespace kvc {
namespace python {

/// Binds `__init__(**kwargs)` on `cls`: default-constructs T, then sets each keyword as an
/// attribute (strings for enum fields are converted by value name).
template <class T, class Class>
void def_kwargs_init(Class& cls) {
  namespace nb = nanobind;
  cls.def(
      "__init__",
      [](nb::pointer_and_handle<T> self, nb::kwargs kwargs) {
        new (self.p) T();
        // The fields are set through Python attributes, so the instance must count as
        // constructed before __init__ returns.
        nb::inst_mark_ready(self.h);
        nb::handle obj = self.h;
        for (auto item : kwargs) {
          nb::object key = nb::borrow(item.first);
          nb::object value = nb::borrow(item.second);
          nb::object current = nb::getattr(obj, key);
          if (nb::isinstance<nb::str>(value) && !nb::isinstance<nb::str>(current) &&
              nb::hasattr(current.type(), "__members__")) {
            value = nb::getattr(current.type(), value);
          }
          nb::setattr(obj, key, value);
        }
      },
      "Default values, then each keyword argument set as a field (enum fields also take the "
      "value's name as a string).");
}

}  // namespace python
}  // namespace kvc
