//! `allox-system-effects-recover`: protocol v3's workspace restore (see
//! `allox_effects::recover`).

fn main() {
    std::process::exit(allox_effects::recover::main());
}
