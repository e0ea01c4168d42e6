//! glibc's own `dlvsym`, found in libc's dynamic symbol table.
//!
//! Before glibc 2.34 `dlvsym` lives in `libdl.so.2`, from 2.34 in `libc.so.6`: both are
//! searched (the interposer needs `libdl.so.2`, so it is loaded wherever that matters).
//!
//! We export a `dlvsym` of our own (so that programs resolving driver entry points with it get
//! our wrappers), and that export would also answer *our* calls to `dlvsym` — including the one
//! that finds glibc's `dlsym`, which everything else rests on. So glibc's `dlvsym` is found
//! without asking the dynamic linker for it by name: `dl_iterate_phdr` gives libc's load
//! address and program headers, its `PT_DYNAMIC` gives the symbol, string and version tables,
//! and a scan of the symbol table finds the default (non-hidden) definition of `dlvsym`.
//!
//! Read-only walks of memory the loader mapped for a loaded object; every table pointer is
//! taken from that object's own dynamic section.

use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
/// `versym` bit of a hidden (non-default, `name@VERSION`) definition.
const VERSYM_HIDDEN: u16 = 0x8000;

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

static DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// glibc's `dlvsym`, or NULL if libc or the symbol cannot be found.
pub fn libc_dlvsym() -> *mut c_void {
    let p = DLVSYM.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let p = find_in_libc(c"dlvsym");
    DLVSYM.store(p, Ordering::Release);
    p
}

struct Search<'a> {
    name: &'a CStr,
    found: *mut c_void,
}

fn find_in_libc(name: &CStr) -> *mut c_void {
    let mut search = Search {
        name,
        found: std::ptr::null_mut(),
    };
    // SAFETY: dl_iterate_phdr calls `visit` with valid dl_phdr_info for each loaded object and
    // our `search` as data; `visit` returns non-zero to stop.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut search).cast()) };
    search.found
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: `data` is the `Search` passed by `find_in_libc`; `info` is valid for this call.
    let (search, info) = unsafe { (&mut *data.cast::<Search<'_>>(), &*info) };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: the loader's NUL-terminated object name.
    let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
    let base_name = name.rsplit(|b| *b == b'/').next().unwrap_or(name);
    if !base_name.starts_with(b"libc.so") && !base_name.starts_with(b"libdl.so") {
        return 0;
    }
    // SAFETY: the program headers of a loaded object, `dlpi_phnum` of them.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) else {
        return 0;
    };
    let base = info.dlpi_addr;
    let dyn_ptr = (base + dynamic.p_vaddr) as *const Dyn;
    // SAFETY: the object's mapped dynamic section, terminated by DT_NULL.
    search.found = unsafe { lookup(base, dyn_ptr, search.name) };
    // Stop at the first object that defines it (libc from 2.34, libdl before).
    c_int::from(!search.found.is_null())
}

/// Finds the default definition of `name` in the object loaded at `base` with dynamic section
/// `dyn_ptr`.
///
/// # Safety
/// `dyn_ptr` must be the dynamic section of an object the loader mapped at `base`.
unsafe fn lookup(base: u64, dyn_ptr: *const Dyn, name: &CStr) -> *mut c_void {
    let (mut strtab, mut symtab, mut versym, mut hash, mut gnu_hash) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut d = dyn_ptr;
    loop {
        // SAFETY: within the dynamic section, which ends with DT_NULL.
        let entry = unsafe { &*d };
        // glibc relocates these in place; a value below the base is still an offset.
        let addr = if entry.val < base {
            entry.val.wrapping_add(base)
        } else {
            entry.val
        };
        match entry.tag {
            DT_NULL => break,
            DT_STRTAB => strtab = addr,
            DT_SYMTAB => symtab = addr,
            DT_VERSYM => versym = addr,
            DT_HASH => hash = addr,
            DT_GNU_HASH => gnu_hash = addr,
            _ => {}
        }
        // SAFETY: advancing within the DT_NULL-terminated array.
        d = unsafe { d.add(1) };
    }
    if strtab == 0 || symtab == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: the hash tables of the same object.
    let count = unsafe {
        if hash != 0 {
            // DT_HASH: nbucket, nchain; nchain is the number of symbols.
            *(hash as *const u32).add(1) as usize
        } else if gnu_hash != 0 {
            gnu_symbol_count(gnu_hash as *const u32)
        } else {
            return std::ptr::null_mut();
        }
    };
    let wanted = name.to_bytes();
    for i in 0..count {
        // SAFETY: i < the number of symbols of the table.
        let sym = unsafe { &*(symtab as *const Sym).add(i) };
        let kind = sym.info & 0xf;
        if sym.shndx == 0 || sym.value == 0 || (kind != STT_FUNC && kind != STT_GNU_IFUNC) {
            continue;
        }
        if versym != 0 {
            // SAFETY: one u16 per symbol.
            let v = unsafe { *(versym as *const u16).add(i) };
            if v & VERSYM_HIDDEN != 0 {
                continue;
            }
        }
        // SAFETY: st_name is an offset into the NUL-terminated string table.
        let sym_name = unsafe { CStr::from_ptr((strtab + u64::from(sym.name)) as *const _) };
        if sym_name.to_bytes() == wanted {
            if kind == STT_GNU_IFUNC {
                // An IFUNC's value is its resolver; dlvsym is a plain function in every glibc
                // we know, and calling a resolver here would be guesswork.
                return std::ptr::null_mut();
            }
            return base.wrapping_add(sym.value) as *mut c_void;
        }
    }
    std::ptr::null_mut()
}

/// Number of symbols in a table indexed by a GNU hash table: one past the highest index any
/// bucket chain reaches.
///
/// # Safety
/// `table` must be an object's `DT_GNU_HASH` table.
unsafe fn gnu_symbol_count(table: *const u32) -> usize {
    // SAFETY: the header and arrays as laid out by the GNU hash format (64-bit bloom words).
    unsafe {
        let nbuckets = *table as usize;
        let symoffset = *table.add(1) as usize;
        let bloom_size = *table.add(2) as usize;
        let buckets = table.add(4 + bloom_size * 2);
        let chains = buckets.add(nbuckets);
        let mut last = (0..nbuckets)
            .map(|b| *buckets.add(b) as usize)
            .max()
            .unwrap_or(0);
        if last < symoffset {
            return symoffset;
        }
        while *chains.add(last - symoffset) & 1 == 0 {
            last += 1;
        }
        last + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_glibcs_dlvsym() {
        let found = libc_dlvsym();
        assert!(!found.is_null(), "libc's dlvsym found in its symbol table");
        // SAFETY: an all-zero Dl_info is a valid value to be overwritten.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables.
        assert!(unsafe { libc::dladdr(found, &mut info) } != 0);
        // SAFETY: dladdr's NUL-terminated name of the symbol at `found`.
        let sym = unsafe { CStr::from_ptr(info.dli_sname) };
        assert_eq!(sym.to_bytes(), b"dlvsym", "the address is libc's dlvsym");
        assert_eq!(info.dli_saddr, found);
    }

    #[test]
    fn absent_names_are_not_found() {
        assert!(find_in_libc(c"arbiter_no_such_function").is_null());
    }
}
