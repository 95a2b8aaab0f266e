//! Safe strided matrix products for the kernels through the `gemm` crate's vectorised
//! microkernels: [`matmul`] single-threaded into a given buffer (the attention kernel parallelises
//! over sequences), [`product`] into a fresh buffer on all threads (the linear layers).

/// A matrix inside a slice: element `(r, c)` at index `r·rs + c·cs`.
#[derive(Clone, Copy, Debug)]
pub struct View {
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl View {
    /// Row-major rows of `cols` elements, `stride` apart.
    pub fn rows(rows: usize, cols: usize, stride: usize) -> View {
        View { rows, cols, rs: stride, cs: 1 }
    }

    pub fn t(self) -> View {
        View { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs }
    }

    fn fits(&self, len: usize) -> bool {
        self.rows == 0 || self.cols == 0 || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < len
    }
}

/// `dst = lhs·rhs`, or `dst += lhs·rhs` when `accumulate`.
pub fn matmul(dst: &mut [f32], dv: View, accumulate: bool, lhs: &[f32], lv: View, rhs: &[f32], rv: View) {
    assert!(dv.fits(dst.len()), "matmul destination out of bounds");
    // SAFETY: `dst` holds the destination view (checked) and is borrowed mutably, so it does not
    // alias the inputs.
    unsafe { gemm_into(dst.as_mut_ptr(), dv, accumulate, lhs, lv, rhs, rv, gemm::Parallelism::None) }
}

/// `lhs·rhs` as a new row-major `[lhs.rows, rhs.cols]` buffer, on all threads when it is large.
/// The buffer is not zeroed first: gemm writes every element (it does not read the destination).
pub fn product(lhs: &[f32], lv: View, rhs: &[f32], rv: View) -> Vec<f32> {
    let (m, n, k) = (lv.rows, rv.cols, lv.cols);
    if m == 0 || n == 0 || k == 0 {
        return vec![0.0; m * n];
    }
    let parallelism = if m * n * k >= 1 << 18 { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
    let mut out: Vec<f32> = Vec::with_capacity(m * n);
    // SAFETY: `out` has room for the m×n row-major destination and is written through the raw
    // pointer only; with `accumulate = false` gemm stores every element without reading any, so
    // all of them are initialised before `set_len`.
    unsafe {
        gemm_into(out.as_mut_ptr(), View::rows(m, n, n), false, lhs, lv, rhs, rv, parallelism);
        out.set_len(m * n);
    }
    out
}

/// The one call into gemm. Checks the shapes and the input views.
///
/// # Safety
/// `dst` must be valid for writes (and, with `accumulate`, reads) at every index of `dv`, and
/// must not alias `lhs` or `rhs`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_into(
    dst: *mut f32,
    dv: View,
    accumulate: bool,
    lhs: &[f32],
    lv: View,
    rhs: &[f32],
    rv: View,
    parallelism: gemm::Parallelism,
) {
    assert!(dv.rows == lv.rows && dv.cols == rv.cols && lv.cols == rv.rows, "matmul shapes {dv:?} = {lv:?}·{rv:?}");
    assert!(lv.fits(lhs.len()) && rv.fits(rhs.len()), "matmul input view out of bounds");
    // SAFETY: the caller vouches for `dst`; the inputs lie inside their slices (checked above);
    // f32 is a type gemm supports. gemm computes dst = α·dst + β·lhs·rhs (α only read when
    // `accumulate`).
    unsafe {
        gemm::gemm(
            dv.rows,
            dv.cols,
            lv.cols,
            dst,
            dv.cs as isize,
            dv.rs as isize,
            accumulate,
            lhs.as_ptr(),
            lv.cs as isize,
            lv.rs as isize,
            rhs.as_ptr(),
            rv.cs as isize,
            rv.rs as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_products_match_the_definition() {
        // lhs 2×3 inside rows of 4; rhs 3×2 read transposed from a 2×3 block.
        let lhs = [1.0, 2.0, 3.0, 9.0, 4.0, 5.0, 6.0, 9.0];
        let rhs_t = [1.0, 0.0, 2.0, 0.0, 1.0, 1.0];
        let mut dst = [10.0; 4];
        matmul(&mut dst, View::rows(2, 2, 2), false, &lhs, View::rows(2, 3, 4), &rhs_t, View::rows(2, 3, 3).t());
        assert_eq!(dst, [7.0, 5.0, 16.0, 11.0]);
        matmul(&mut dst, View::rows(2, 2, 2), true, &lhs, View::rows(2, 3, 4), &rhs_t, View::rows(2, 3, 3).t());
        assert_eq!(dst, [14.0, 10.0, 32.0, 22.0]);
        assert_eq!(product(&lhs, View::rows(2, 3, 4), &rhs_t, View::rows(2, 3, 3).t()), vec![7.0, 5.0, 16.0, 11.0]);
    }
}
