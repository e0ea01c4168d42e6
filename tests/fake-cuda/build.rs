// Link the fake driver like the real one:
// * the real driver's SONAME, so that programs linked with `-lcuda` record `libcuda.so.1` and
//   `dlopen("libcuda.so.1", RTLD_NOLOAD)` finds it like the real one;
// * `-Bsymbolic` (the real libcuda is linked with DT_SYMBOLIC): the driver's references to its
//   own functions bind inside the driver, so the addresses its `cuGetProcAddress` hands out are
//   its own exports, never the preloaded interposer's. Without it the fake would return the
//   interposer's wrappers by itself and tests of the interposer's pointer substitution could
//   not fail.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rerun-if-changed=build.rs");
}
