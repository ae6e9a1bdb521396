// Vision transforms for dataset::map, as MindSpore's: rescale, normalize, hwc2chw,
// type_cast, random_crop, random_horizontal_flip, resize (bilinear).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/error.hpp>
#include <tessera/data/column.hpp>
#include <tessera/data/node.hpp>
#include <tessera/data/random.hpp>

namespace tessera::data {

namespace detail {
/// Height, width and channels of an image of shape (H, W) or (H, W, C).
struct image_dims {
  std::size_t h, w, c;
};
inline image_dims image_shape(const std::string& name, const array& a) {
  const std::vector<std::size_t> s = a.shape();
  if (s.size() != 2 && s.size() != 3)
    throw error(name + ": the image must have shape (height, width) or (height, width, channels): got " +
                shape_string(s));
  return {s[0], s[1], s.size() == 3 ? s[2] : 1};
}
/// v rounded to the nearest integer (halves away from zero), saturated to T's range.
template <class T>
T round_to(float v) {
  if constexpr (std::is_same_v<T, std::uint8_t>) {  // the common case, without int64
    return static_cast<std::uint8_t>((v >= 0.0f ? std::min(v, 255.0f) : 0.0f) + 0.5f);
  } else {
    constexpr float lo = static_cast<float>(std::numeric_limits<T>::min());
    constexpr float hi = static_cast<float>(std::numeric_limits<T>::max());
    if (!(v == v)) return T{0};
    const float c = std::clamp(v, lo, hi);
    auto t = static_cast<std::int64_t>(c);  // toward zero
    const float r = c - static_cast<float>(t);
    t += (r >= 0.5f) - (r <= -0.5f);
    return static_cast<T>(std::clamp<std::int64_t>(t, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
  }
}
/// The elements as float32: moved out when they are float32 already, else converted.
inline xt::xarray<float> take_float(array a) {
  if (a.type() == dtype::float32) return std::move(a.get<float>());
  return a.to<float>();
}
/// An array of T with the shape of an (H, W) or (H, W, C) image.
template <class T>
xt::xarray<T> image_like(const array& a, std::size_t h, std::size_t w, std::size_t c) {
  if (a.ndim() == 2) return xt::xarray<T>::from_shape({h, w});
  return xt::xarray<T>::from_shape({h, w, c});
}
}  // namespace detail

/// x * scale + shift, element by element, as float32 (MindSpore's Rescale):
/// rescale(1.0f / 255, 0) maps uint8 pixels to [0, 1].
inline transform rescale(float scale, float shift) {
  return [=](array a) {
    xt::xarray<float> x = detail::take_float(std::move(a));
    float* v = x.data();
    for (std::size_t i = 0, n = x.size(); i < n; ++i) v[i] = v[i] * scale + shift;
    return array(std::move(x));
  };
}

/// (x[..., c] - mean[c]) / std[c] over the last dim (the channels of an HWC image), as
/// float32 (MindSpore's Normalize). One mean and std per channel.
inline transform normalize(std::vector<float> mean, std::vector<float> stddev) {
  if (mean.size() != stddev.size() || mean.empty())
    throw error("normalize: give one mean and one std per channel: got " + std::to_string(mean.size()) +
                " means and " + std::to_string(stddev.size()) + " stds");
  for (std::size_t c = 0; c < stddev.size(); ++c)
    if (!(stddev[c] > 0))
      throw error("normalize: every std must be positive: std[" + std::to_string(c) + "] = " +
                  std::to_string(stddev[c]));
  return [mean = std::move(mean), stddev = std::move(stddev)](array a) {
    const std::vector<std::size_t> s = a.shape();
    if (s.empty() || s.back() != mean.size())
      throw error("normalize: the image's last dim (channels) must equal the number of means: image shape " +
                  detail::shape_string(s) + ", " + std::to_string(mean.size()) + " means");
    xt::xarray<float> x = detail::take_float(std::move(a));
    const std::size_t c = mean.size();
    float* v = x.data();
    for (std::size_t k = 0; k < c; ++k) {
      const float m = mean[k], d = stddev[k];
      for (std::size_t i = k, n = x.size(); i < n; i += c) v[i] = (v[i] - m) / d;
    }
    return array(std::move(x));
  };
}

/// (H, W, C) -> (C, H, W), any dtype (MindSpore's HWC2CHW).
inline transform hwc2chw() {
  return [](array a) {
    const std::vector<std::size_t> s = a.shape();
    if (s.size() != 3)
      throw error("hwc2chw: the image must have shape (height, width, channels): got " + detail::shape_string(s));
    return a.visit([&](auto& x) {
      using T = typename std::decay_t<decltype(x)>::value_type;
      const std::size_t h = s[0], w = s[1], c = s[2];
      if (c == 1) {  // the same bytes: only the shape changes
        x.reshape({1, h, w});
        return array(std::move(x));
      }
      xt::xarray<T> out = xt::xarray<T>::from_shape({c, h, w});
      const T* in = x.data();
      for (std::size_t k = 0; k < c; ++k) {
        T* o = out.data() + k * h * w;
        for (std::size_t p = 0; p < h * w; ++p) o[p] = in[p * c + k];
      }
      return array(std::move(out));
    });
  };
}

/// Converts the elements to `t` (MindSpore's TypeCast): float to integer truncates
/// toward zero and saturates (NaN gives 0); int32 to uint8 saturates.
inline transform type_cast(dtype t) {
  return [t](const array& a) { return a.cast(t); };
}

/// Padding of an image's four sides, in MindSpore's order (left, top, right, bottom);
/// one number pads all four.
struct padding {
  std::int64_t left = 0, top = 0, right = 0, bottom = 0;
  padding() = default;
  padding(std::int64_t all) : left(all), top(all), right(all), bottom(all) {}  // NOLINT: implicit
  padding(std::int64_t l, std::int64_t t, std::int64_t r, std::int64_t b) : left(l), top(t), right(r), bottom(b) {}
};

/// Pads the image with zeros by `pad`, then cuts a height x width window at a random
/// offset, uniform over every offset that fits (MindSpore's RandomCrop with constant
/// fill 0). Images of shape (H, W) or (H, W, C), any dtype. The offset is drawn from
/// rng::for_sample(seed, sample): the same for a sample in a pass on every run.
///
///     random_crop(32, 32, 4)   // CIFAR-10's augmentation: pad to 40x40, crop 32x32
inline transform random_crop(std::int64_t height, std::int64_t width, padding pad = {}, std::uint64_t seed = 0) {
  if (height < 1 || width < 1)
    throw error("random_crop: the crop size must be positive: got " + std::to_string(height) + "x" +
                std::to_string(width));
  if (pad.left < 0 || pad.top < 0 || pad.right < 0 || pad.bottom < 0)
    throw error("random_crop: the padding must not be negative");
  return [=](const array& a, const sample_info& info) {
    const detail::image_dims d = detail::image_shape("random_crop", a);
    const std::size_t h = d.h, w = d.w, c = d.c;
    const std::int64_t ph = static_cast<std::int64_t>(h) + pad.top + pad.bottom;
    const std::int64_t pw = static_cast<std::int64_t>(w) + pad.left + pad.right;
    if (height > ph || width > pw)
      throw error("random_crop: the crop " + std::to_string(height) + "x" + std::to_string(width) +
                  " is larger than the padded image " + std::to_string(ph) + "x" + std::to_string(pw));
    rng g = rng::for_sample(seed, info, 0x63726f70);
    const std::int64_t y0 = static_cast<std::int64_t>(g.below(static_cast<std::uint64_t>(ph - height + 1))) - pad.top;
    const std::int64_t x0 = static_cast<std::int64_t>(g.below(static_cast<std::uint64_t>(pw - width + 1))) - pad.left;
    return a.visit([&](const auto& x) {
      using T = typename std::decay_t<decltype(x)>::value_type;
      xt::xarray<T> out = detail::image_like<T>(a, static_cast<std::size_t>(height), static_cast<std::size_t>(width), c);
      std::fill(out.data(), out.data() + out.size(), T{0});
      for (std::int64_t y = 0; y < height; ++y) {
        const std::int64_t sy = y0 + y;
        if (sy < 0 || sy >= static_cast<std::int64_t>(h)) continue;
        for (std::int64_t xx = 0; xx < width; ++xx) {
          const std::int64_t sx = x0 + xx;
          if (sx < 0 || sx >= static_cast<std::int64_t>(w)) continue;
          const T* src = x.data() + (static_cast<std::size_t>(sy) * w + static_cast<std::size_t>(sx)) * c;
          std::copy(src, src + c, out.data() + (static_cast<std::size_t>(y * width + xx)) * c);
        }
      }
      return array(std::move(out));
    });
  };
}

/// Mirrors the image left-right with probability `prob` (MindSpore's
/// RandomHorizontalFlip), drawn from rng::for_sample(seed, sample). (H, W) or (H, W, C).
inline transform random_horizontal_flip(float prob = 0.5f, std::uint64_t seed = 0) {
  if (!(prob >= 0 && prob <= 1))
    throw error("random_horizontal_flip: the probability must be in [0, 1]: got " + std::to_string(prob));
  return [=](array a, const sample_info& info) {
    const detail::image_dims d = detail::image_shape("random_horizontal_flip", a);
    const std::size_t h = d.h, w = d.w, c = d.c;
    rng g = rng::for_sample(seed, info, 0x666c6970);
    if (!(g.uniform() < prob) || w == 0) return a;
    a.visit([&](auto& x) {
      for (std::size_t y = 0; y < h; ++y)
        for (std::size_t l = 0, r = w - 1; l < r; ++l, --r)
          std::swap_ranges(x.data() + (y * w + l) * c, x.data() + (y * w + l + 1) * c, x.data() + (y * w + r) * c);
    });
    return a;
  };
}

/// Bilinear resize to height x width (MindSpore's Resize with its default bilinear
/// interpolation). Pixel centres are at half-integers (OpenCV's INTER_LINEAR, PyTorch's
/// align_corners=False): output pixel y samples input row
///     sy = (y + 0.5) * H_in / H_out - 0.5,
/// clamped to [0, H_in - 1], weighting rows floor(sy) and floor(sy) + 1 by their
/// distance; columns alike. Computed in float; integer images round to nearest and
/// saturate (OpenCV's fixed-point uint8 path may differ from this by 1). Upsizing
/// (0, 10; 20, 30) to 4x4 gives first row 0, 2.5, 7.5, 10; halving takes 2x2 means.
inline transform resize(std::int64_t height, std::int64_t width) {
  if (height < 1 || width < 1)
    throw error("resize: the size must be positive: got " + std::to_string(height) + "x" + std::to_string(width));
  return [=](const array& a) {
    const detail::image_dims d = detail::image_shape("resize", a);
    const std::size_t h = d.h, w = d.w, c = d.c;
    if (h == 0 || w == 0) throw error("resize: the image is empty: shape " + detail::shape_string(a.shape()));
    const std::size_t oh = static_cast<std::size_t>(height), ow = static_cast<std::size_t>(width);
    // Source index and weight of the upper/left neighbour, per output row / column.
    auto taps = [](std::size_t in, std::size_t out) {
      std::vector<std::pair<std::size_t, float>> t(out);
      const double scale = static_cast<double>(in) / static_cast<double>(out);
      for (std::size_t i = 0; i < out; ++i) {
        const double s = std::clamp((static_cast<double>(i) + 0.5) * scale - 0.5, 0.0, static_cast<double>(in - 1));
        const std::size_t i0 = static_cast<std::size_t>(s);
        t[i] = {i0, static_cast<float>(s - static_cast<double>(i0))};
      }
      return t;
    };
    const auto ty = taps(h, oh), tx = taps(w, ow);
    return a.visit([&](const auto& x) {
      using T = typename std::decay_t<decltype(x)>::value_type;
      xt::xarray<T> out = detail::image_like<T>(a, oh, ow, c);
      // Separable: interpolate input rows along x into r0 / r1 (each input row once
      // while consecutive output rows share it), then blend the two rows along y.
      const std::size_t n = ow * c;
      std::vector<float> r0(n), r1(n);
      std::size_t have0 = h, have1 = h;  // h: no row yet
      auto along_x = [&](std::size_t r, std::vector<float>& dst) {
        const T* src = x.data() + r * w * c;
        for (std::size_t xo = 0; xo < ow; ++xo) {
          const std::size_t a0 = tx[xo].first * c, a1 = std::min(tx[xo].first + 1, w - 1) * c;
          const float fx = tx[xo].second;
          for (std::size_t k = 0; k < c; ++k) {
            const float p = static_cast<float>(src[a0 + k]), q = static_cast<float>(src[a1 + k]);
            dst[xo * c + k] = p + fx * (q - p);
          }
        }
      };
      for (std::size_t y = 0; y < oh; ++y) {
        const std::size_t y0 = ty[y].first, y1 = std::min(y0 + 1, h - 1);
        const float fy = ty[y].second;
        if (have0 != y0) {
          if (have1 == y0) {
            std::swap(r0, r1);
            std::swap(have0, have1);
          } else {
            along_x(y0, r0);
            have0 = y0;
          }
        }
        if (have1 != y1) {
          along_x(y1, r1);
          have1 = y1;
        }
        T* o = out.data() + y * n;
        for (std::size_t i = 0; i < n; ++i) {
          const float v = r0[i] + fy * (r1[i] - r0[i]);
          if constexpr (std::is_floating_point_v<T>) o[i] = v;
          else o[i] = detail::round_to<T>(v);
        }
      }
      return array(std::move(out));
    });
  };
}

}  // namespace tessera::data
