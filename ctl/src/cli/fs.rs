//! A session's files: `alloxctl fs` (list, read, make, remove, watch,
//! rename) and `alloxctl cp`.

use super::Action;
use allox_client::files::Remote;
use allox_protocol::{FsList, FsMkdir, FsMove, FsRemove, FsStat, Request};
use clap::{Args, Subcommand};

/// Which tree of a session a path is in.
#[derive(Args, Debug, Default, PartialEq, Clone)]
pub struct FsWhere {
    /// In the agent's shared/ instead of the session's files.
    #[arg(long)]
    pub shared: bool,
}

/// The same, or a checkpoint's tree (read-only).
#[derive(Args, Debug, Default, PartialEq, Clone)]
pub struct FsWhereRead {
    #[command(flatten)]
    pub place: FsWhere,
    /// As it was at this checkpoint.
    #[arg(long, value_name = "ID", conflicts_with = "shared")]
    pub checkpoint: Option<String>,
}

impl FsWhere {
    fn scope(&self) -> allox_protocol::FsScope {
        if self.shared {
            allox_protocol::FsScope::Shared
        } else {
            allox_protocol::FsScope::Session
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum FsCommand {
    /// List a directory (the session's root by default).
    Ls {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The directory (default: the top).
        #[arg(default_value = "")]
        path: String,
        /// Levels below it (default 1).
        #[arg(long)]
        depth: Option<u32>,
        #[command(flatten)]
        at: FsWhereRead,
    },
    /// Print a file's bytes, as they are.
    Cat {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The path, from the top of the scope.
        path: String,
        #[command(flatten)]
        at: FsWhereRead,
    },
    /// What is at a path.
    Stat {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The path, from the top of the scope.
        path: String,
        #[command(flatten)]
        at: FsWhereRead,
    },
    /// Remove a file or an empty directory (with -r, a whole tree).
    Rm {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The path, from the top of the scope.
        path: String,
        /// A directory with everything in it.
        #[arg(short, long)]
        recursive: bool,
        #[command(flatten)]
        at: FsWhere,
    },
    /// Make a directory (with -p, its parents too).
    Mkdir {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The path, from the top of the scope.
        path: String,
        /// Its missing parents too, and no error if it exists.
        #[arg(short, long)]
        parents: bool,
        #[command(flatten)]
        at: FsWhere,
    },
    /// Report changes below a directory as they happen (Ctrl-C to stop);
    /// a rollback of the session shows as one `rolled_back`.
    Watch {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The directory (default: the top).
        #[arg(default_value = "")]
        path: String,
        /// Its subdirectories too.
        #[arg(short, long)]
        recursive: bool,
        #[command(flatten)]
        at: FsWhere,
    },
    /// Rename a path.
    Mv {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The path to rename.
        from: String,
        /// Its new path.
        to: String,
        #[command(flatten)]
        at: FsWhere,
    },
}

impl FsCommand {
    pub fn action(self) -> Action {
        let remote = |agent: String, session: String, path: String, at: FsWhereRead| Remote {
            agent,
            session,
            path,
            scope: at.place.scope(),
            checkpoint: at.checkpoint,
        };
        Action::Call(match self {
            FsCommand::Ls {
                agent,
                session,
                path,
                depth,
                at,
            } => Request::FsList(FsList {
                agent_id: agent,
                session_id: session,
                scope: at.place.scope(),
                checkpoint_id: at.checkpoint,
                path,
                depth,
            }),
            FsCommand::Cat {
                agent,
                session,
                path,
                at,
            } => return Action::Cat(remote(agent, session, path, at)),
            FsCommand::Stat {
                agent,
                session,
                path,
                at,
            } => Request::FsStat(FsStat {
                agent_id: agent,
                session_id: session,
                scope: at.place.scope(),
                checkpoint_id: at.checkpoint,
                path,
            }),
            FsCommand::Rm {
                agent,
                session,
                path,
                recursive,
                at,
            } => Request::FsRemove(FsRemove {
                agent_id: agent,
                session_id: session,
                scope: at.scope(),
                path,
                recursive,
            }),
            FsCommand::Mkdir {
                agent,
                session,
                path,
                parents,
                at,
            } => Request::FsMkdir(FsMkdir {
                agent_id: agent,
                session_id: session,
                scope: at.scope(),
                path,
                parents,
            }),
            FsCommand::Watch {
                agent,
                session,
                path,
                recursive,
                at,
            } => {
                return Action::Follow(Request::FsWatch(allox_protocol::FsWatch {
                    agent_id: agent,
                    session_id: session,
                    scope: at.scope(),
                    path,
                    recursive,
                }))
            }
            FsCommand::Mv {
                agent,
                session,
                from,
                to,
                at,
            } => Request::FsMove(FsMove {
                agent_id: agent,
                session_id: session,
                scope: at.scope(),
                path: from,
                to,
            }),
        })
    }
}

/// `alloxctl cp`.
#[derive(Args, Debug)]
pub struct CpArgs {
    /// A local path, or AGENT/SESSION:PATH.
    pub from: String,
    /// A local path, or AGENT/SESSION:PATH.
    pub to: String,
    /// The session's path is in its agent's shared/.
    #[arg(long)]
    pub shared: bool,
    /// Copy from the session as it was at this checkpoint.
    #[arg(long, value_name = "ID")]
    pub checkpoint: Option<String>,
    /// Send the bytes in frames even where the daemon could move them
    /// itself from the open file (the path the gateway and the VM's
    /// control port take).
    #[arg(long)]
    pub framed: bool,
    /// Say how each file's bytes moved: reflink, copy_file_range or
    /// sendfile (the daemon moved them from the open file passed to it),
    /// or in frames.
    #[arg(short, long)]
    pub verbose: bool,
}

impl CpArgs {
    pub fn action(self) -> Action {
        Action::Copy {
            from: self.from,
            to: self.to,
            shared: self.shared,
            checkpoint: self.checkpoint,
            framed: self.framed,
            verbose: self.verbose,
        }
    }
}
