//! The busy kernel, as hand-written PTX (no nvcc).
//!
//! `burn(u32 iters, u32* sink)`: each thread runs `iters` steps of a linear
//! congruential generator on a register and stores the result to `sink`
//! only if it happens to be zero, so the loop cannot be optimised away and
//! the store (almost) never happens. PTX ISA 6.0, target sm_52: every driver
//! since CUDA 9 JIT-compiles it for its GPU (sm_90 on an H200). The simulated
//! driver accepts any image and times kernels by thread count.

/// Entry point name.
pub const ENTRY: &str = "burn";

/// NUL-terminated PTX text for `cuModuleLoadData`.
pub const PTX: &str = "\
.version 6.0
.target sm_52
.address_size 64

.visible .entry burn(
    .param .u32 burn_iters,
    .param .u64 burn_sink
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<3>;

    ld.param.u32 %r1, [burn_iters];
    ld.param.u64 %rd1, [burn_sink];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, 0;
LOOP:
    setp.ge.u32 %p1, %r3, %r1;
    @%p1 bra DONE;
    mad.lo.u32 %r2, %r2, 1664525, 1013904223;
    add.u32 %r3, %r3, 1;
    bra LOOP;
DONE:
    setp.ne.u32 %p2, %r2, 0;
    @%p2 bra END;
    st.global.u32 [%rd2], %r2;
END:
    ret;
}
\0";

#[cfg(test)]
mod tests {
    #[test]
    fn ptx_is_nul_terminated_and_declares_the_entry() {
        assert!(super::PTX.ends_with('\0'));
        assert_eq!(super::PTX.matches('\0').count(), 1);
        assert!(super::PTX.contains(&format!(".entry {}(", super::ENTRY)));
        assert!(super::PTX.starts_with(".version 6.0\n.target sm_52"));
    }
}
