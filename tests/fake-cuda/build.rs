// Give the fake driver the real driver's SONAME so that programs linked with `-lcuda` record
// `libcuda.so.1` and `dlopen("libcuda.so.1", RTLD_NOLOAD)` finds it like the real one.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
