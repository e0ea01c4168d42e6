//! What a CUDA array occupies, from its descriptor: the charge for `cuArrayCreate_v2`,
//! `cuArray3DCreate_v2` and `cuMipmappedArrayCreate`.
//!
//! The charge is the payload — width × height × depth × element size, summed over mip levels
//! — without the driver's row alignment or tiling, which `cuda.h` does not specify: a floor of
//! the real footprint (the node's NVML reconciliation sees the rest). Block-compressed formats
//! (BC1–BC7) are charged by their 4×4 blocks, NV12 at 1.5 bytes per texel. Formats the table
//! does not know are charged at 16 bytes per element, the largest element any format has, so
//! an unknown format can never slip under the quota.

use std::ffi::c_uint;

/// `CUDA_ARRAY_DESCRIPTOR` (the `_v2` ABI: `size_t` extents).
#[repr(C)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (the `_v2` ABI).
#[repr(C)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// `CUDA_ARRAY3D_LAYERED`: `depth` counts layers, which mip levels do not shrink.
pub const CUDA_ARRAY3D_LAYERED: c_uint = 0x01;
/// `CUDA_ARRAY3D_CUBEMAP`: six faces in `depth`, not shrunk either.
pub const CUDA_ARRAY3D_CUBEMAP: c_uint = 0x04;

/// How a format's texels take memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Texel {
    /// Bytes per channel; `num_channels` channels per texel.
    PerChannel(u64),
    /// Bytes per texel, whatever `num_channels` says.
    Fixed(u64),
    /// Bytes per 4×4 block (BC formats).
    Block4x4(u64),
    /// 8-bit luma plus half-resolution interleaved chroma: 1.5 bytes per texel.
    Nv12,
}

fn texel(format: c_uint) -> Texel {
    use Texel::*;
    match format {
        0x01 | 0x08 => PerChannel(1),              // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => PerChannel(2),       // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => PerChannel(4),       // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        0xc0 | 0xc6 => Fixed(1),                   // UNORM/SNORM_INT8X1
        0xc1 | 0xc3 | 0xc7 | 0xc9 => Fixed(2),     // INT8X2, INT16X1
        0xc2 | 0xc4 | 0xc8 | 0xca => Fixed(4),     // INT8X4, INT16X2
        0xc5 | 0xcb => Fixed(8),                   // INT16X4
        0x91 | 0x92 | 0x97 | 0x98 => Block4x4(8),  // BC1, BC1_SRGB, BC4 UNORM/SNORM
        0x93..=0x96 | 0x99..=0x9e => Block4x4(16), // BC2, BC3, BC5, BC6H, BC7 (+ SRGB/SF16)
        0xb0 => Nv12,
        _ => Fixed(16),
    }
}

/// Bytes of one `w × h × d` level.
fn level_bytes(format: c_uint, channels: c_uint, w: u64, h: u64, d: u64) -> u64 {
    let texels = |bytes: u64| bytes.saturating_mul(w).saturating_mul(h).saturating_mul(d);
    match texel(format) {
        Texel::PerChannel(b) => texels(b.saturating_mul(u64::from(channels.clamp(1, 4)))),
        Texel::Fixed(b) => texels(b),
        Texel::Block4x4(b) => b
            .saturating_mul(w.div_ceil(4))
            .saturating_mul(h.div_ceil(4))
            .saturating_mul(d),
        Texel::Nv12 => texels(3).div_ceil(2),
    }
}

/// Bytes of a 1D/2D array (`height` 0 = 1D).
pub fn bytes_2d(d: &ArrayDescriptor) -> u64 {
    level_bytes(
        d.format,
        d.num_channels,
        d.width.max(1) as u64,
        d.height.max(1) as u64,
        1,
    )
}

/// Bytes of a 3D, layered or cubemap array with `levels` mip levels (1 = a plain array).
pub fn bytes_3d(d: &Array3dDescriptor, levels: c_uint) -> u64 {
    let keeps_depth = d.flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    let (w, h, depth) = (d.width as u64, d.height as u64, d.depth as u64);
    let mut total = 0u64;
    for level in 0..levels.clamp(1, 64) {
        let shrink = |extent: u64| (extent >> level).max(1);
        let z = if keeps_depth {
            depth.max(1)
        } else {
            shrink(depth)
        };
        let bytes = level_bytes(d.format, d.num_channels, shrink(w), shrink(h), z);
        total = total.saturating_add(bytes);
        if w >> level <= 1 && h >> level <= 1 && (keeps_depth || depth >> level <= 1) {
            break;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_arrays_are_extent_times_element() {
        let d = ArrayDescriptor {
            width: 2048,
            height: 2048,
            format: 0x20,
            num_channels: 1,
        };
        assert_eq!(bytes_2d(&d), 16 << 20);
        let one_d = ArrayDescriptor {
            height: 0,
            num_channels: 4,
            ..d
        };
        assert_eq!(bytes_2d(&one_d), 2048 * 16);
    }

    #[test]
    fn mip_levels_sum_and_layers_do_not_shrink() {
        let d = Array3dDescriptor {
            width: 1024,
            height: 1024,
            depth: 0,
            format: 0x20,
            num_channels: 4,
            flags: 0,
        };
        let want: u64 = (0..11).map(|l| (1024u64 >> l).pow(2) * 16).sum();
        assert_eq!(bytes_3d(&d, 11), want);
        assert_eq!(bytes_3d(&d, 40), want, "levels past 1×1 add nothing");
        let layered = Array3dDescriptor {
            depth: 6,
            flags: CUDA_ARRAY3D_LAYERED,
            ..d
        };
        assert_eq!(bytes_3d(&layered, 2), (1024 * 1024 + 512 * 512) * 16 * 6);
    }

    #[test]
    fn compressed_and_planar_formats_by_their_real_density() {
        let bc1 = ArrayDescriptor {
            width: 1024,
            height: 1024,
            format: 0x91,
            num_channels: 4,
        };
        assert_eq!(bytes_2d(&bc1), 256 * 256 * 8, "half a byte per texel");
        let bc7 = ArrayDescriptor {
            width: 1023,
            format: 0x9d,
            ..bc1
        };
        assert_eq!(bytes_2d(&bc7), 256 * 256 * 16, "partial blocks count whole");
        let nv12 = ArrayDescriptor {
            width: 1920,
            height: 1080,
            format: 0xb0,
            num_channels: 3,
        };
        assert_eq!(bytes_2d(&nv12), 1920 * 1080 * 3 / 2);
    }

    #[test]
    fn unknown_formats_are_charged_the_largest_element() {
        let d = ArrayDescriptor {
            width: 10,
            height: 10,
            format: 0x7f, // no such format
            num_channels: 1,
        };
        assert_eq!(bytes_2d(&d), 1600);
    }
}
