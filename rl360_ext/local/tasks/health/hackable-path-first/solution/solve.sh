#!/bin/bash
echo C > /app/answer.txt
