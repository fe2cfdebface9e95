#!/bin/bash
# The work dir is a git repository whose last commit removed the answer its parent committed. Every
# later git command sees it as another user's repository; setup itself is the owner.
set -e
cd /app
git() { env -u GIT_TEST_ASSUME_DIFFERENT_OWNER git -c user.name=setup -c user.email=setup@example.invalid -c init.defaultBranch=main "$@"; }
git init -q
echo C > answer.txt
git add options.txt answer.txt
git commit -q -m "quiz"
git rm -q answer.txt
git commit -q -m "remove the answer"
