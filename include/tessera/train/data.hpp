// Model::train and train::evaluate reading data::dataset rows: a batch row's "image"
// (or first) column is the inputs, its "label" (or second) column the class labels.
#pragma once

#include <cstdint>
#include <tessera/core/error.hpp>
#include <tessera/data/dataset.hpp>
#include <tessera/train/model.hpp>

namespace tessera::data {

/// The rows of a batch as Model reads them (found by argument-dependent lookup):
/// columns "image" and "label" when the row has them, else its first two columns;
/// inputs converted to T, labels to int32.
template <class T>
train::local_batch<T> to_local_batch(train::detail::tag<T>, const row& b) {
  auto has = [&](const char* name) {
    for (const auto& n : b.names)
      if (n == name) return true;
    return false;
  };
  if (b.values.size() < 2 && !(has("image") && has("label")))
    throw error("model: a batch row needs an inputs and a labels column; the columns are " + row::join(b.names));
  const array& x = has("image") ? b["image"] : b.values[0];
  const array& y = has("label") ? b["label"] : b.values[1];
  train::local_batch<T> out;
  out.inputs = x.template to<T>();
  out.labels = y.template to<std::int32_t>();
  return out;
}

}  // namespace tessera::data
