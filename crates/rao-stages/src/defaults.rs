//! Default values that several kinds' params share, for `#[serde(default = "…")]`.

pub fn one_usize() -> usize {
    1
}

pub fn one_f64() -> f64 {
    1.0
}

pub fn yes() -> bool {
    true
}

pub fn one_u32() -> u32 {
    1
}
