// Give the fake the real library's SONAME so that it is interchangeable with libnvidia-ml.so.1.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
