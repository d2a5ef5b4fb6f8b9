fn main() -> std::process::ExitCode {
    outbox_lab::cmd::main()
}
