//! Small fork-safe primitives: a spin lock that the `atfork` child handler can
//! reset, and one-shot messages on stderr written with `write(2)`.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// A spin lock. Unlike `std::sync::Mutex` it can be forcibly reset in a fork
/// child, where a thread of the parent that held it no longer exists. Critical
/// sections are short map operations; no driver call is made while holding it.
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `locked` (see `lock`).
unsafe impl<T: Send> Sync for SpinLock<T> {}

pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> Self {
        SpinLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    pub fn lock(&self) -> SpinGuard<'_, T> {
        let mut spins = 0u32;
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        SpinGuard { lock: self }
    }

    /// Fork child only: the lock may be held by a thread that does not exist
    /// here. Releases it without running any destructor.
    pub fn force_unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard exists only while `locked` is held by us.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in deref; the guard is borrowed mutably, so this is the only reference.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// Writes `libegpu: <msg>\n` to stderr in one `write(2)` (no std lock, so it
/// is safe after `fork`).
pub fn say(msg: &str) {
    let line = format!("libegpu: {msg}\n");
    let b = line.as_bytes();
    // SAFETY: writes `b.len()` initialised bytes from `b` to fd 2.
    let _ = unsafe { libc::write(2, b.as_ptr().cast(), b.len()) };
}

/// Like [`say`], at most once per `flag`.
pub fn say_once(flag: &AtomicBool, msg: impl FnOnce() -> String) {
    if !flag.swap(true, Ordering::AcqRel) {
        say(&msg());
    }
}

/// Whether the environment variable `name` is set, not empty and not `0`;
/// read once, then cached in `state` (0: not read yet).
pub fn env_flag(state: &std::sync::atomic::AtomicU8, name: &str) -> bool {
    match state.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0");
            state.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        s => s == 2,
    }
}

/// Whether `EGPU_HOOK_DEBUG` is set (logs every accounting decision).
pub fn debug_enabled() -> bool {
    static STATE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    env_flag(&STATE, "EGPU_HOOK_DEBUG")
}

macro_rules! debug {
    ($($t:tt)*) => {
        if $crate::util::debug_enabled() {
            $crate::util::say(&format!($($t)*));
        }
    };
}
pub(crate) use debug;

/// Reads a C string argument; `None` for null or non-UTF-8.
pub(crate) fn cstr<'a>(p: *const std::ffi::c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller (C code) passed a NUL-terminated string that lives for the call.
    unsafe { std::ffi::CStr::from_ptr(p) }.to_str().ok()
}
