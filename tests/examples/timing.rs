use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::Instant;
fn main() {
    let fs = allox_integration::BtrfsFs::new(2048).unwrap();
    let p = fs.path();
    std::fs::create_dir(p.join("nocow")).unwrap();
    std::process::Command::new("chattr")
        .arg("+C")
        .arg(p.join("nocow"))
        .status()
        .unwrap();
    for dir in ["", "nocow"] {
        let d = p.join(dir);
        let j = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("j"))
            .unwrap();
        let mut v = vec![];
        for _ in 0..30 {
            let t = Instant::now();
            (&j).write_all(&[0u8; 100]).unwrap();
            j.sync_data().unwrap();
            v.push(t.elapsed());
        }
        v.sort();
        println!("{dir} append+fdatasync p50 {:?}", v[15]);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .read(true)
            .open(d.join("pre"))
            .unwrap();
        f.write_all_at(&vec![0u8; 1 << 20], 0).unwrap();
        f.sync_all().unwrap();
        let mut v = vec![];
        for i in 0..30u64 {
            let t = Instant::now();
            f.write_all_at(&[1u8; 100], i * 100).unwrap();
            f.sync_data().unwrap();
            v.push(t.elapsed());
        }
        v.sort();
        println!("{dir} prealloc overwrite+fdatasync p50 {:?}", v[15]);
        const T: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("t");
        let db = redb::Database::create(d.join("db.redb")).unwrap();
        let mut v = vec![];
        for i in 0..30u64 {
            let t = Instant::now();
            let w = db.begin_write().unwrap();
            {
                w.open_table(T).unwrap().insert(i, i).unwrap();
            }
            w.commit().unwrap();
            v.push(t.elapsed());
        }
        v.sort();
        println!("{dir} redb commit p50 {:?}", v[15]);
    }
}
