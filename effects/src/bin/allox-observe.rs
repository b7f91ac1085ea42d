//! `allox-observe`: the system-effects observer. Started by the supervisor
//! from a sealed copy of this executable, with its conversation on its
//! standard input (see `allox_effects::observer::wire`).

fn main() {
    std::process::exit(allox_effects::observer::main());
}
