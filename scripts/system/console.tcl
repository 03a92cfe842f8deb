# The console dialogs of scripts/system/scenarios.sh (sourced by `expect -c`): agetty and login
# serve ttyS1, which qemu wires to ttyS2, where the test types. What the terminal shows goes to
# stdout and is appended to the results' console-dialogs.log; expect's own trace to
# console-dialogs.trace (what it matched, when).
set timeout 60
log_user 1
log_file -a /run/dirseal-results/console-dialogs.log
exp_internal -f /run/dirseal-results/console-dialogs.trace 0
set tty [open /dev/ttyS2 r+]
fconfigure $tty -mode 115200,n,8,1 -translation binary -buffering none
spawn -open $tty

proc bye {code why} { puts "\nEXPECT: $why"; exit $code }

# A fresh login prompt, then USER typed. The line may still hold prompts of earlier dialogs, and
# agetty and login flush what was typed ahead when they switch the terminal's mode: wait until
# the prompts stop coming. A password prompt (login took the empty line for a name) is answered
# empty, which only brings the next prompt.
proc login_as {user} {
  send "\r"
  expect "login: " {} "Password: " { answer ""; exp_continue } timeout { bye 2 "no login prompt" }
  # After an empty password, login says "Login incorrect" and exits (LOGIN_RETRIES 1): wait for
  # agetty's next prompt, which on a slow guest takes longer than the quiet spell below.
  expect -timeout 3 "login: " { exp_continue } "Password: " {
    answer ""
    expect -timeout 90 "login: " {} timeout { bye 2 "no login prompt after a refused empty login" }
    exp_continue
  } timeout {}
  send "$user\r"
}

# An answer to a prompt, after a pause (login flushes what is typed before it reads).
proc answer {text} { sleep 1; send "$text\r" }

# Until the shell's prompt; a password prompt instead is exit 6, a refusal exit 3.
proc shell_prompt {} {
  expect {
    -re {\$ $} {}
    "Password: " { send "\r"; expect "Login incorrect"; bye 6 "asked for a password" }
    "Login incorrect" { bye 3 "login refused" }
    timeout { bye 4 "no shell prompt" }
  }
}

# CMD in the shell, then logout; exits with CMD's status.
proc run_and_logout {cmd} {
  send "export SYSTEMD_PAGER=cat PAGER=cat; $cmd; echo CONSOLE-DONE-\$?\r"
  expect {
    -re {CONSOLE-DONE-([0-9]+)} { set rc $expect_out(1,string) }
    timeout { bye 5 "command did not finish" }
  }
  send "exit\r"
  expect "login: "
  exit $rc
}
