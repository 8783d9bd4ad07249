//! A client process for end-to-end tests (a vLLM worker stand-in that can be killed):
//!
//! * `put SOCKET KEY LEN` — puts a value derived from KEY; exit 0 when acknowledged.
//! * `get SOCKET KEY LEN` — gets KEY and checks it is exactly the derived value; exit 0 if so,
//!   1 on a miss, 3 on wrong bytes.
//! * `hang-put SOCKET KEY LEN` — reserves KEY, copies half of the value into its local extents,
//!   prints `reserved` and waits forever (the test kills it mid-put).

use std::process::ExitCode;

use regolith_client::conn::Conn;
use regolith_client::shm::Mapping;
use regolith_client::{Client, ClientConfig, ReplicateConfig};
use regolith_proto::uds::{pb, Op};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: e2e-client put|get|hang-put SOCKET KEY LEN");
        return ExitCode::from(2);
    }
    let (cmd, socket, key) = (&args[1], &args[2], &args[3]);
    let Ok(len) = args[4].parse::<usize>() else {
        return ExitCode::from(2);
    };
    let value = regolith_e2e::value(key, len);
    match cmd.as_str() {
        "put" => {
            let c = match Client::connect(ClientConfig::new(socket)) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(1);
                }
            };
            match c.put(
                key,
                &value,
                &ReplicateConfig {
                    prefer_local: true,
                    ..Default::default()
                },
            ) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("put {key}: {e}");
                    ExitCode::from(1)
                }
            }
        }
        "get" => {
            let c = match Client::connect(ClientConfig::new(socket)) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(1);
                }
            };
            match c.get(key) {
                Ok(v) if v == value => ExitCode::SUCCESS,
                Ok(_) => ExitCode::from(3),
                Err(e) => {
                    eprintln!("get {key}: {e}");
                    ExitCode::from(1)
                }
            }
        }
        "hang-put" => hang_put(socket, key, &value),
        _ => ExitCode::from(2),
    }
}

fn hang_put(socket: &str, key: &str, value: &[u8]) -> ExitCode {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (conn, hello) = match Conn::connect(socket.as_ref(), 0, "hang-put").await {
            Ok(x) => x,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(1);
            }
        };
        let seg = Mapping::from_fd(hello.segment_fd.expect("a segment"), "segment").expect("map");
        let req = pb::PutBeginRequest {
            items: vec![pb::PutBeginItem {
                key: key.into(),
                size: value.len() as u64,
                options: Some(pb::PutOptions {
                    prefer_local: true,
                    replicas: 1,
                    ..Default::default()
                }),
            }],
        };
        let r: pb::PutBeginReply = conn.call(Op::PutBegin, &req).await.expect("put_begin");
        let t = &r.items[0];
        assert_eq!(t.status.as_ref().map(|s| s.code), Some(0), "{:?}", t.status);
        let e = &t.local_extents[0];
        seg.write(e.offset, &value[..value.len() / 2])
            .expect("copy");
        println!("reserved");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::future::pending::<()>().await;
        ExitCode::SUCCESS
    })
}
