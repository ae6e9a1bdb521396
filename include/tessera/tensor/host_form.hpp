// host_form: a host shard's values laid out otherwise than row-major, as a kernel reads
// and writes them (oneDNN's blocked layouts of convolution weights: kernels/cpu/dnnl.hpp).
// A host dist_tensor can hold one beside its row-major shard or instead of it, so that
// the weights a convolution reordered stay reordered between steps: the kernels that
// understand the form read and update it in place, and the row-major shard is made
// again from it when anything else reads the tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

namespace tessera {

/// The values of a host shard in a layout of a kernel's own. Implementations say what
/// they are (kind()), how to bring the values to and from row-major order, and whether
/// two forms lay the values out alike.
template <class T>
class host_form {
 public:
  virtual ~host_form() = default;

  /// Which implementation this is (each kernel family has its own tag), so that a kernel
  /// can tell its own forms from others.
  virtual std::uint32_t kind() const = 0;
  /// The form's buffer, in its own order.
  virtual std::span<T> values() = 0;
  virtual std::span<const T> values() const = 0;
  /// Whether the buffer holds exactly the shard's elements, reordered (no padding): an
  /// element-wise update of several tensors can then run on their buffers directly when
  /// their forms lay the values out alike (same_layout).
  virtual bool is_permutation() const = 0;
  /// Whether `other` lays out the same shape the same way.
  virtual bool same_layout(const host_form& other) const = 0;
  /// Writes the values to `dst` in row-major order (the shard's element count).
  virtual void to_plain(T* dst) const = 0;
  /// Sets the values from `src` in row-major order.
  virtual void from_plain(const T* src) = 0;
  /// A form of the same layout, its values unspecified.
  virtual std::unique_ptr<host_form> empty_like() const = 0;
  /// A form of the same layout without a buffer, to remember the layout by: only its
  /// kind(), same_layout() and empty_like() may be called.
  virtual std::unique_ptr<host_form> layout_only() const = 0;
};

}  // namespace tessera
