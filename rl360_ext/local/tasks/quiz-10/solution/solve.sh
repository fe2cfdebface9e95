#!/bin/bash
echo B > /app/answer.txt
